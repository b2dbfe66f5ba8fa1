"""moe_route vs the same routing in stock torch ops, both captured in CUDA graphs (SPEC 3).

    python benchmarks/bench_moe_route.py [--quick] [--results FILE]
"""

from __future__ import annotations

import torch

import torch_sparse_decode  # noqa: F401  (registers the ops)
from harness import Table, graph_us, parser, rotation

SCALE = 2.5


def stock_route(scores, bias, topk):
    """What a model runner writes without us: topk(s + b), gather, renormalize, scale."""
    _, ids = torch.topk(scores + bias, topk, dim=1)
    weights = scores.gather(1, ids)
    return weights / weights.sum(dim=1, keepdim=True) * SCALE, ids.to(torch.int32)


def bench(experts: int, topk: int, tokens: int):
    bias = torch.randn(experts, device="cuda") * 0.1
    sets = rotation(lambda seed: torch.rand(tokens, experts, device="cuda"), tokens * experts * 4)
    weights = torch.empty(tokens, topk, device="cuda")
    ids = torch.empty(tokens, topk, dtype=torch.int32, device="cuda")
    route = torch.ops.sparse_decode.moe_route

    ours = graph_us(lambda i: route(sets[i % len(sets)], bias, topk, True, SCALE, False, weights, ids))
    stock = graph_us(lambda i: stock_route(sets[i % len(sets)], bias, topk))
    return ours, stock


def main() -> None:
    args = parser(__doc__).parse_args()
    shapes = [(896, 16), (256, 8)]
    tokens = [1, 64] if args.quick else [1, 8, 64, 256, 4096]
    table = Table("moe_route", ["E/topk", "T", "ours (us)", "stock torch (us)", "speedup", "bar (us)", "meets bar"])
    for experts, topk in shapes:
        for t in tokens:
            ours, stock = bench(experts, topk, t)
            bar = 3.0 if t <= 64 else 5.0 if t <= 256 else None
            speed_ok = stock / ours >= 6 or stock < 40
            ok = "n/a" if bar is None else ("yes" if ours <= bar and speed_ok else "no")
            table.add(f"{experts}/{topk}", t, ours, stock, f"{stock / ours:.1f}x", bar or "-", ok)
    table.emit(args.results)


if __name__ == "__main__":
    main()
