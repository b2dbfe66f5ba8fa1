"""moe_gate_route (the router front) beside the unfused path, both captured in CUDA graphs.

    python benchmarks/bench_moe_gate_route.py [--quick] [--results FILE]

The unfused path is what a runner writes today: the bf16 hidden states times the router weights
to fp32 logits (``torch.mm(..., out_dtype=torch.float32)``, cuBLAS), then our ``moe_route``
kernel with its sigmoid. The op takes the one-launch front up to its switch (``FRONT_TOKENS``)
and that same unfused path above it; the "front kernel" column times the front at every T it
can take (up to ``front.MAX_TOKENS``), so the switch point stays a measurement. Shapes: Kimi K3
(896 experts, hidden 7168, top 16) and DeepSeek-V3 (256 experts in 8 groups, 4 kept, top 8),
T = 1 .. 64; all-equal rows (zero hidden states: CUDA-graph padding) and NaN rows (NaN hidden
states: every logit NaN, each ranking as -inf) beside random ones, the bar holding for all
three. The floor is one read of the router weights at the copy bandwidth measured in the same
run. The "PDL"
column launches each call as a programmatic dependent of the one before (``kernels/pdl.py``): the
front copies its weights before it waits, so that read overlaps the previous call's tail, as it
overlaps the kernel before the router in a model (``bench_pdl.py`` times that). The "split GEMM"
column times the op with the front off and the opt-in split router GEMM on
(``TORCH_SPARSE_DECODE_ROUTER_SPLIT``, ``ops/moe_gate_route/split.py``) at every T it takes.
"""

from __future__ import annotations

import torch

import torch_sparse_decode  # noqa: F401  (registers the ops)
from torch_sparse_decode.kernels import pdl
from torch_sparse_decode.ops.moe_gate_route import front as front_kernel, kernel as gate_kernel, split
from harness import Table, copy_bandwidth_tbs, graph_us, parser, rotation, switched

WIDTH = 7168
SCALE = 2.5


def bench(table: Table, bandwidth: float, experts: int, topk: int, groups: int, kept: int, tokens: int,
          bar: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    bias = torch.randn(experts, device="cuda", generator=gen) * 0.05
    # Fresh router weights per set, so every call reads them from memory (a layer's weights are
    # not in L2 when its router runs).
    sets = rotation(lambda seed: (torch.randn(tokens, WIDTH, device="cuda").bfloat16(),
                                  (torch.randn(experts, WIDTH, device="cuda") * WIDTH ** -0.5).bfloat16()),
                    experts * WIDTH * 2)
    weights = torch.empty(tokens, topk, device="cuda")
    ids = torch.empty(tokens, topk, dtype=torch.int32, device="cuda")
    logits = torch.empty(tokens, experts, device="cuda")
    front, route = torch.ops.sparse_decode.moe_gate_route, torch.ops.sparse_decode.moe_route

    def ours(sets):
        return graph_us(lambda i: front(*sets[i % len(sets)], bias, topk, True, SCALE, groups, kept, weights, ids,
                                        logits))

    def unfused(i):
        hidden, gate = sets[i % len(sets)]
        scores = torch.mm(hidden, gate.t(), out_dtype=torch.float32)
        route(scores, bias, topk, True, SCALE, True, groups, kept, weights, ids)

    padding = [(torch.zeros_like(h), g) for h, g in sets]
    nan = [(torch.full_like(h, float("nan")), g) for h, g in sets]
    fused, fused_tied, fused_nan, base = ours(sets), ours(padding), ours(nan), graph_us(unfused)
    with switched(pdl, "ON", True):
        dependent = ours(sets)
    forced = "-"
    if tokens <= front_kernel.MAX_TOKENS:
        with gate_kernel.front_up_to(front_kernel.MAX_TOKENS):
            forced = ours(sets)
    split_us = "-"
    if tokens <= split.MAX_TOKENS:
        with switched(split, "SPLIT", True), gate_kernel.front_up_to(0):
            split_us = ours(sets)
    floor_us = experts * WIDTH * 2 / (bandwidth * 1e12) * 1e6
    ok = max(fused, fused_tied, fused_nan) <= bar
    table.add(f"{experts}/{topk}", f"{groups}/{kept}", tokens, fused, fused_tied, fused_nan, dependent, forced,
              split_us, base, f"{base / fused:.2f}x", floor_us, bar, "yes" if ok else "no")


def main() -> None:
    args = parser(__doc__).parse_args()
    bandwidth = copy_bandwidth_tbs()
    table = Table("moe_gate_route: router GEMM + sigmoid + routing", [
        "E/topk", "groups/kept", "T", "ours (us)", "ours, zero hidden (us)", "ours, NaN hidden (us)", "ours, PDL (us)",
        "front kernel (us)", "split GEMM (us)", "unfused (us)", "speedup", "one read of the weights (us)", "bar (us)",
        "meets bar"])
    # (experts, topk, groups, kept, [(tokens, bar)])
    shapes = [(896, 16, 1, 1, [(1, 5.5), (4, 5.5), (8, 5.5), (16, 8.0), (32, 8.0), (64, 8.0)]),
              (256, 8, 8, 4, [(1, 3.5), (4, 3.5), (8, 3.5), (64, 5.0)])]
    for experts, topk, groups, kept, cases in shapes:
        for tokens, bar in cases[:: 3 if args.quick else 1]:
            bench(table, bandwidth, experts, topk, groups, kept, tokens, bar)
    table.emit(args.results)


if __name__ == "__main__":
    main()
