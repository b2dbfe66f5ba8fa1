"""Where the router front's time goes: a build with phase stamps (``front.PHASES``: each CTA's
thread 0 reads %globaltimer at the end of each phase) run at the model shapes; this prints, per
shape, when each phase ends, in us after the first CTA started: the median and the latest over
the CTAs that take it (only CTAs t < T consume: "records in", "routed"); "start" is when each CTA
began, the launch's spread over the CTAs; "weights in" when thread 0's copies of its weight
vectors had landed, so "GEMV" minus it is the FMAs that follow the read.

    python benchmarks/profile_front.py [--results FILE]

One eager call per shape (the third), after a 256 MiB write that clears L2, so the weights come
from HBM. The timer's step is printed too (the least gap between distinct stamps): phases closer
than it cannot be told apart.
"""

from __future__ import annotations

import torch

import torch_sparse_decode as tsd
from harness import Table, parser
from torch_sparse_decode.kernels.topk import sm_count
from torch_sparse_decode.ops.moe_gate_route import front, kernel

WIDTH = 7168
# (experts, topk, groups, kept, tokens): Kimi K3 and DeepSeek-V3
SHAPES = [(896, 16, 1, 1, 1), (896, 16, 1, 1, 4), (896, 16, 1, 1, 8), (256, 8, 8, 4, 1), (256, 8, 8, 4, 4)]


def stamps(experts: int, topk: int, groups: int, kept: int, tokens: int) -> torch.Tensor:
    """[CTAs, phases] stamps (ns after the first CTA's start; -1: phase not taken) of one call,
    whose routing is checked against moe_route of its own logits."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    hidden = torch.randn(tokens, WIDTH, device="cuda", generator=gen).bfloat16()
    gate = (torch.randn(experts, WIDTH, device="cuda", generator=gen) * WIDTH ** -0.5).bfloat16()
    bias = 0.05 * torch.randn(experts, device="cuda", generator=gen)
    ctas = front.ctas_for(experts, sm_count(hidden.device))
    bulk, mma = front.switches()
    fn = front.compiled(experts, WIDTH, topk, True, groups, kept, ctas, front.chunk_for(tokens, mma), bulk=bulk,
                        mma=mma, profile=True)
    box = front.workspace(hidden.device, experts)
    state = torch.zeros(4 + ctas * len(front.PHASES), dtype=torch.int64, device="cuda")
    weights = torch.empty(tokens, topk, device="cuda")
    ids = torch.empty(tokens, topk, dtype=torch.int32, device="cuda")
    logits = torch.empty(tokens, experts, device="cuda")
    flush = torch.empty(64 << 20, device="cuda")  # 256 MiB: the weights are not left in L2
    for _ in range(3):
        flush.zero_()
        state[4:] = 0
        fn(hidden.view(torch.int32), gate.view(torch.int32), bias, 2.5, weights, ids, logits, box.words, state,
           kernel.TIMEOUT_NS, -1)
    torch.cuda.synchronize()
    assert int(state[2]) == 0, "a consumer's wait ran out"
    want = tsd.moe_route(torch.sigmoid(logits), bias, topk, scale=2.5, num_expert_group=groups, topk_group=kept)
    assert torch.equal(ids, want[1]), "the profiled build routed differently"
    marks = state[4:].view(ctas, len(front.PHASES)).cpu()
    first = marks[:, 0].min()
    return torch.where(marks > 0, marks - first, torch.full_like(marks, -1))


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table("moe_gate_route front phases (us after the first CTA's start: median / latest over the CTAs)",
                  ["E/topk", "groups/kept", "T", "CTAs", *front.PHASES],
                  "one eager call per shape (the third), after a 256 MiB write that clears L2")
    step = None
    for experts, topk, groups, kept, tokens in SHAPES:
        ns = stamps(experts, topk, groups, kept, tokens)
        cells = []
        for p in range(len(front.PHASES)):
            taken = ns[:, p][ns[:, p] >= 0].double() / 1e3
            cells.append(f"{taken.median().item():.2f} / {taken.max().item():.2f}" if len(taken) else "-")
        table.add(f"{experts}/{topk}", f"{groups}/{kept}", tokens, ns.shape[0], *cells)
        distinct = torch.unique(ns[ns >= 0])
        if len(distinct) > 1:
            gap = int((distinct[1:] - distinct[:-1]).min())
            step = gap if step is None else min(step, gap)
    table.emit(args.results)
    print(f"least gap between distinct stamps: {step} ns")


if __name__ == "__main__":
    main()
