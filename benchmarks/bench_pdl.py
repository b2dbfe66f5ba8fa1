"""Programmatic dependent launch (``kernels/pdl.py``, whose per-op default ``DEFAULT_ON`` is set
from this) behind the kernel a runner has before each op: the router GEMM before ``moe_route``,
the residual add that writes the hidden states before the router front (``moe_gate_route``), the
indexer's score GEMM before ``indexer_topk`` and before the DCP pack (``dcp.pack_candidates``: the
local select, then the pack). Each step (the kernel before, then the op) is captured in a CUDA
graph and timed with our kernels launched plainly and as programmatic dependents, switched in the
same process, beside the kernel before alone.

    python benchmarks/bench_pdl.py [--quick] [--results FILE]

``moe_route`` at T >= 1536 (grouped) or 3072 takes the warp kernel (``ops/moe_route/warps.py``).
"""

from __future__ import annotations

import torch

import torch_sparse_decode as tsd
from harness import Table, graph_us, parser, rotation, switched
from torch_sparse_decode import dcp
from torch_sparse_decode.kernels import pdl

HIDDEN = 7168


def timed(before, op, sets) -> tuple[float, float, float]:
    """(the kernel before alone, it then the op plainly, it then the op as its programmatic
    dependent), us a step."""
    alone = graph_us(lambda i: before(*sets[i % len(sets)]))
    steps = []
    for on in (False, True):
        with switched(pdl, "ON", on):
            steps.append(graph_us(lambda i: op(before(*sets[i % len(sets)]))))
    return alone, *steps


def route_case(tokens: int):
    experts = 256
    gate = torch.randn(experts, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    bias = torch.randn(experts, device="cuda") * 0.05
    sets = rotation(lambda seed: (torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16),),
                    tokens * HIDDEN * 2 + experts * HIDDEN * 2)
    gemm = lambda x: x @ gate.t()  # noqa: E731  (bf16 logits, as a runner's router GEMM gives them)
    op = lambda logits: tsd.moe_route(logits, bias, 8, scale=2.5, apply_sigmoid=True,  # noqa: E731
                                      num_expert_group=8, topk_group=4)
    return gemm, op, sets


def front_case(tokens: int, experts: int, topk: int, groups: int, kept: int):
    bias = torch.randn(experts, device="cuda") * 0.05
    # Fresh router weights per set: a layer's weights are not in L2 when its router runs.
    sets = rotation(lambda seed: (torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16),
                                  torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16),
                                  (torch.randn(experts, HIDDEN, device="cuda") * HIDDEN ** -0.5).bfloat16()),
                    experts * HIDDEN * 2)
    add = lambda attn, residual, gate: (attn + residual, gate)  # noqa: E731  (the residual add writes hidden)
    op = lambda pair: tsd.moe_gate_route(pair[0], pair[1], bias, topk, scale=2.5,  # noqa: E731
                                         num_expert_group=groups, topk_group=kept)
    return add, op, sets


def indexer_case(rows: int, width: int):
    dim = 128
    cache = torch.randn(width, dim, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    sets = rotation(lambda seed: (torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16),),
                    width * dim * 2 + rows * width * 2)
    gemm = lambda q: q @ cache.t()  # noqa: E731  (bf16 index scores)
    op = lambda scores: tsd.indexer_topk(scores, lengths, 2048)  # noqa: E731
    return gemm, op, sets


def pack_case(rows: int, width: int, world_size: int = 2):
    gemm, _, sets = indexer_case(rows, width)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    op = lambda scores: dcp.pack_candidates(scores, lengths, world_size, 0, 2048)  # noqa: E731
    return gemm, op, sets


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table("our kernels as programmatic dependents of the kernel before (us a step)",
                  ["op", "shape", "kernel before", "it alone", "it + op", "it + op, PDL", "saved by PDL"])

    def add(name, shape, before, case):
        alone, plain, dependent = timed(*case)
        table.add(name, shape, before, alone, plain, dependent, f"{plain - dependent:+.2f}")

    for tokens in (1, 64) if args.quick else (1, 64, 256, 4096):
        add("moe_route DeepSeek-V3", f"T={tokens}", "router GEMM", route_case(tokens))
    for experts, topk, groups, kept in ((896, 16, 1, 1), (256, 8, 8, 4)):
        for tokens in (1,) if args.quick else (1, 4):
            add(f"moe_gate_route {experts}/{topk}", f"T={tokens}", "residual add",
                front_case(tokens, experts, topk, groups, kept))
    for rows, width in ((8, 8 << 10),) if args.quick else ((1, 8 << 10), (8, 8 << 10), (64, 8 << 10),
                                                          (8, 32 << 10), (8, 128 << 10)):
        add("indexer_topk k=2048", f"{rows}x{width >> 10}K bf16", "score GEMM", indexer_case(rows, width))
    for rows in (1,) if args.quick else (1, 32):
        add("dcp pack W=2 K=2048", f"{rows}x64K bf16", "score GEMM", pack_case(rows, 64 << 10))
    table.emit(args.results)


if __name__ == "__main__":
    main()
