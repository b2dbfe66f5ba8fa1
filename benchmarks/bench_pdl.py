"""Programmatic dependent launch (``TORCH_SPARSE_DECODE_PDL``) behind the kernel a runner has before
each op: the router GEMM before ``moe_route``, the indexer's score GEMM before ``indexer_topk``.
Each step (the GEMM, then the op) is captured in a CUDA graph and timed with the op launched
plainly and as a programmatic dependent, switched in the same process, beside the GEMM alone.

    python benchmarks/bench_pdl.py [--quick] [--results FILE]

``moe_route`` at T >= 512 takes the tile kernel where ``TORCH_SPARSE_DECODE_ROUTE_TILES=1``.
"""

from __future__ import annotations

import torch

import torch_sparse_decode as tsd
from harness import Table, graph_us, parser, rotation


def switch(on: bool) -> None:
    """Every kernel that reads ``compile.PDL`` at its call: the engine's launch and moe_route."""
    from torch_sparse_decode.kernels.topk import launch
    from torch_sparse_decode.ops.moe_route import kernel

    launch.PDL = kernel.PDL = on


def timed(gemm, op, sets) -> tuple[float, float, float]:
    """(GEMM alone, GEMM then op plainly, GEMM then op as its programmatic dependent), us a step."""
    alone = graph_us(lambda i: gemm(*sets[i % len(sets)]))
    steps = []
    for on in (False, True):
        switch(on)
        steps.append(graph_us(lambda i: op(gemm(*sets[i % len(sets)]))))
    switch(False)
    return alone, *steps


def route_case(tokens: int):
    hidden, experts = 7168, 256
    gate = torch.randn(experts, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    bias = torch.randn(experts, device="cuda") * 0.05
    sets = rotation(lambda seed: (torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16),),
                    tokens * hidden * 2 + experts * hidden * 2)
    gemm = lambda x: x @ gate.t()  # noqa: E731  (bf16 logits, as a runner's router GEMM gives them)
    op = lambda logits: tsd.moe_route(logits, bias, 8, scale=2.5, apply_sigmoid=True,  # noqa: E731
                                      num_expert_group=8, topk_group=4)
    return gemm, op, sets


def indexer_case(rows: int, width: int):
    dim = 128
    cache = torch.randn(width, dim, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    sets = rotation(lambda seed: (torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16),),
                    width * dim * 2 + rows * width * 2)
    gemm = lambda q: q @ cache.t()  # noqa: E731  (bf16 index scores)
    op = lambda scores: tsd.indexer_topk(scores, lengths, 2048)  # noqa: E731
    return gemm, op, sets


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table("the op as a programmatic dependent of the GEMM before it (us a step)",
                  ["op", "shape", "GEMM alone", "GEMM + op", "GEMM + op, PDL", "saved by PDL"])
    for tokens in (1, 64) if args.quick else (1, 64, 256, 4096):
        alone, plain, pdl = timed(*route_case(tokens))
        table.add("moe_route DeepSeek-V3", f"T={tokens}", alone, plain, pdl, f"{plain - pdl:+.2f}")
    for rows, width in ((8, 8 << 10),) if args.quick else ((1, 8 << 10), (8, 8 << 10), (64, 8 << 10),
                                                          (8, 32 << 10), (8, 128 << 10)):
        alone, plain, pdl = timed(*indexer_case(rows, width))
        table.add("indexer_topk k=2048", f"{rows}x{width >> 10}K bf16", alone, plain, pdl, f"{plain - pdl:+.2f}")
    table.emit(args.results)


if __name__ == "__main__":
    main()
