"""Where the top-k engine's cycles go: a build with phase marks (``RadixTopk(profile=True)``,
``kernels/topk.py`` PHASES) stamps the SM clock at the end of each phase; this prints, per shape,
the median over rows and CTAs of each phase's cycles. Phases a shape does not take read 0. ncu
has no counters on our machines; this is the profiler.

    python benchmarks/profile_topk.py [--quick] [--results FILE]

Cycles, not microseconds: the SM clock under load is not known here (divide a call's time from
bench_topk.py by the total for the effective clock).
"""

from __future__ import annotations

import torch

from compare_topk import K, QUICK, SHAPES
from harness import Table, parser
from torch_sparse_decode.kernels import topk


def phase_cycles(what: str, rows: int, width: int, block_size: int) -> tuple[int, list[float]]:
    """(cluster size, median cycles of each phase) for one call on random scores."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn(rows, width, device="cuda", generator=gen)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    src, block, k_sel, pinned = scores, 1, K, False
    if what == "blocks":
        src, block, k_sel, pinned = topk.block_keys(scores, lengths, block_size), block_size, K - 1, True
    ranks = topk.cluster_size(rows, src.shape[1], topk.sm_count(scores.device))
    phases = len(topk.PHASES)
    out = torch.full((rows, k_sel + 1 + ranks * phases), -7, dtype=torch.int32, device="cuda")
    engine = topk.compiled(src.dtype, pinned, ranks, what == "ord16", profile=True)
    for _ in range(3):  # the last call's marks, warm
        engine(src, lengths, width, block, k_sel, out)
    torch.cuda.synchronize()
    ends = out[:, k_sel + 1:].reshape(rows, ranks, phases).double().cpu()
    # A phase's cycles: its end minus the latest end before it (phases not taken read 0).
    before = torch.cummax(torch.cat([torch.zeros(rows, ranks, 1, dtype=torch.double), ends[..., :-1]], -1), -1).values
    spent = torch.where(ends > 0, ends - before, torch.zeros_like(ends))
    return ranks, spent.reshape(rows * ranks, phases).median(dim=0).values.tolist()


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table(f"Top-k engine phases, k = {K} (SM cycles per CTA, median over rows and CTAs)",
                  ["shape", "CTAs per row", *topk.PHASES, "total"])
    for what, rows, width, block_size in QUICK if args.quick else SHAPES:
        ranks, cycles = phase_cycles(what, rows, width, block_size)
        shape = f"{what} {rows}x{width >> 10}K" + (f" bs={block_size}" if what == "blocks" else "")
        table.add(shape, ranks, *[round(c) for c in cycles], round(sum(cycles)))
    table.emit(args.results)


if __name__ == "__main__":
    main()
