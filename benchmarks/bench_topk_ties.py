"""The top-k ops on tie-heavy rows, beside the same shape on randn rows, in CUDA graphs (the harness's method).

    python benchmarks/bench_topk_ties.py [--quick | --short] [--results FILE]

Distributions: rows where thousands of keys share a value or a coarse bin (CUDA-graph padding
rows, ReLU'd indexer scores, narrow distributions). The engine's bar: every one within 1.3x of
the same shape's randn time.
"""

from __future__ import annotations

import torch

import torch_sparse_decode  # noqa: F401  (registers the ops)
from harness import Table, graph_us, parser, rotation

K = 2048
RATIO_BAR = 1.3


def distribution(name: str, rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, device="cuda", generator=gen)
    if name == "all equal":
        return torch.full_like(x, 0.5)
    if name == "4 distinct values":
        return torch.tensor([0.1, 0.5, 1.0, 2.0], device="cuda")[torch.randint(0, 4, x.shape, device="cuda",
                                                                              generator=gen)]
    if name == "1 + 1e-6 randn":
        return 1 + 1e-6 * x
    if name == "1 + 1e-3 randn":
        return 1 + 1e-3 * x
    if name == "ascending":
        return torch.arange(width, device="cuda", dtype=torch.float32).expand(rows, width).contiguous()
    if name == "ReLU(randn - 3)":
        return torch.relu(x - 3)
    return x


DISTRIBUTIONS = ("randn", "all equal", "4 distinct values", "1 + 1e-6 randn", "1 + 1e-3 randn", "ascending",
                 "ReLU(randn - 3)")


def bench(op: str, rows: int, width: int, name: str, block_size: int = 8) -> float:
    def make(seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return distribution(name, rows, width, gen), torch.full((rows,), width, dtype=torch.int32, device="cuda")

    sets = rotation(make, rows * width * 4)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    if op == "indexer_topk":
        call = torch.ops.sparse_decode.indexer_topk
        return graph_us(lambda i: call(*sets[i % len(sets)], K, out))
    call = torch.ops.sparse_decode.select_candidate_blocks
    return graph_us(lambda i: call(*sets[i % len(sets)], block_size, K, out))


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--short", action="store_true", help="decode's everyday rows instead: 1-256 x 8K, 8-256 x 32K")
    args = cli.parse_args()
    everyday = [("indexer_topk", rows, 8 << 10) for rows in (1, 8, 64, 256)] + \
        [("indexer_topk", rows, 32 << 10) for rows in (8, 64, 256)]
    shapes = everyday if args.short else [("indexer_topk", 8, 128 << 10)] if args.quick else [
        ("indexer_topk", 8, 128 << 10), ("indexer_topk", 64, 128 << 10), ("indexer_topk", 8, 1 << 20),
        ("indexer_topk", 64, 1 << 20), ("select_candidate_blocks bs=8", 8, 128 << 10),
        ("select_candidate_blocks bs=8", 8, 1 << 20)]
    table = Table(f"top-k on tie-heavy rows, k={K} (us per call; in brackets: x the shape's randn time)",
                  ["op", "shape", *DISTRIBUTIONS, f"all within {RATIO_BAR}x randn"])
    for op, rows, width in shapes:
        times = [bench(op.split()[0], rows, width, name) for name in DISTRIBUTIONS]
        cells = [f"{times[0]:.1f}"] + [f"{t:.1f} ({t / times[0]:.2f}x)" for t in times[1:]]
        ok = "yes" if max(times) <= RATIO_BAR * times[0] else "no"
        table.add(op, f"{rows}x{width >> 10}K", *cells, ok)
    table.emit(args.results)


if __name__ == "__main__":
    main()
