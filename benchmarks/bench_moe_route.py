"""moe_route vs the same routing in stock torch ops, both captured in CUDA graphs.

    python benchmarks/bench_moe_route.py [--quick] [--results FILE]

Shapes: Kimi-K3's 896 experts / top 16; DeepSeek-V3's 256 experts in 8 groups, 4 kept, top 8
(its baseline is DeepSeek-V3's own routing code); 512 / 22 and 1024 / 32; and bf16 scores at
896 / 16 beside fp32. Beside random scores: all-equal rows (CUDA-graph padding) and NaN rows
(every score NaN: each ranks as -inf), both with zero bias; the bar holds for all three.
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


def deepseek_v3_route(scores, bias, topk, groups, kept):
    """DeepSeek-V3's own grouped routing in stock torch ops (group mask -inf)."""
    tokens, experts = scores.shape
    keyed = scores + bias
    group_scores = keyed.view(tokens, groups, -1).topk(2, dim=-1).values.sum(dim=-1)
    group_idx = torch.topk(group_scores, kept, dim=-1, sorted=False).indices
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).bool()
    mask = mask.unsqueeze(-1).expand(tokens, groups, experts // groups).reshape(tokens, experts)
    ids = torch.topk(keyed.masked_fill(~mask, float("-inf")), topk, dim=-1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(dim=-1, keepdim=True) * SCALE, ids.to(torch.int32)


def bench(experts: int, topk: int, tokens: int, groups: int = 1, kept: int = 1, dtype=torch.float32):
    bias = torch.randn(experts, device="cuda") * 0.1
    sets = rotation(lambda seed: torch.rand(tokens, experts, device="cuda").to(dtype),
                    tokens * experts * dtype.itemsize)
    weights = torch.empty(tokens, topk, device="cuda")
    ids = torch.empty(tokens, topk, dtype=torch.int32, device="cuda")
    route = torch.ops.sparse_decode.moe_route

    ours = graph_us(lambda i: route(sets[i % len(sets)], bias, topk, True, SCALE, False, groups, kept, weights, ids))
    tied = [torch.full_like(x, 0.5) for x in sets]  # all-equal rows (CUDA-graph padding), zero bias
    flat = torch.zeros_like(bias)
    ours_tied = graph_us(lambda i: route(tied[i % len(tied)], flat, topk, True, SCALE, False, groups, kept, weights,
                                         ids))
    nan = [torch.full_like(x, float("nan")) for x in sets]
    ours_nan = graph_us(lambda i: route(nan[i % len(nan)], flat, topk, True, SCALE, False, groups, kept, weights,
                                        ids))
    if groups > 1:
        stock = graph_us(lambda i: deepseek_v3_route(sets[i % len(sets)].float(), bias, topk, groups, kept))
    else:
        stock = graph_us(lambda i: stock_route(sets[i % len(sets)].float(), bias, topk))
    return ours, ours_tied, ours_nan, stock


def main() -> None:
    args = parser(__doc__).parse_args()
    # (experts, topk, groups, kept, dtype, bar at T <= 64, bar at T = 256)
    shapes = [(896, 16, 1, 1, torch.float32, 3.0, 5.0), (896, 16, 1, 1, torch.bfloat16, 3.0, 5.0),
              (256, 8, 8, 4, torch.float32, 3.0, 5.0), (256, 8, 1, 1, torch.float32, 3.0, 5.0),
              (512, 22, 1, 1, torch.float32, 3.5, None), (1024, 32, 1, 1, torch.float32, 3.5, None)]
    tokens = [1, 64] if args.quick else [1, 8, 64, 256, 4096]
    table = Table("moe_route", ["E/topk", "groups/kept", "scores", "T", "ours (us)", "ours, all-equal rows (us)",
                                "ours, NaN rows (us)", "stock torch (us)", "speedup",
                                "bar (us)", "meets bar"],
                  "stock torch: DeepSeek-V3's own routing code where grouped, else topk(s + b), gather, "
                  "renormalize, scale (on fp32 scores)")
    for experts, topk, groups, kept, dtype, bar_64, bar_256 in shapes:
        for t in tokens:
            ours, ours_tied, ours_nan, stock = bench(experts, topk, t, groups, kept, dtype)
            bar = bar_64 if t <= 64 else bar_256 if t <= 256 else None
            speed_ok = stock / ours >= 6 or stock < 40
            ok = "n/a" if bar is None else ("yes" if max(ours, ours_tied, ours_nan) <= bar and speed_ok else "no")
            table.add(f"{experts}/{topk}", f"{groups}/{kept}", str(dtype).replace("torch.", ""), t, ours, ours_tied,
                      ours_nan, stock, f"{stock / ours:.1f}x", bar or "-", ok)
    table.emit(args.results)


if __name__ == "__main__":
    main()
