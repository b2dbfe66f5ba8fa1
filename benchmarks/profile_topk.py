"""Where the top-k engine's cycles go: a build with phase marks (``RadixTopk(profile=True)``,
``kernels/topk_engine.py`` PHASES) stamps the SM clock at the end of each phase; this prints, per shape,
the median over rows and CTAs of each phase's cycles. Phases a shape does not take read 0. ncu
has no counters on our machines; this is the profiler.

    python benchmarks/profile_topk.py [--quick] [--results FILE]

Cycles, not microseconds (the SM clock ran at 1980 MHz under this load, by nvidia-smi). A second
table reads the global timer each CTA stamps at its start and end: the kernel's span from the
first CTA's start to the last one's end, against the median and slowest CTA, shows how much of a
call is spent outside the median CTA's phases (late starts, slow CTAs).
"""

from __future__ import annotations

import torch

from compare_topk import K, QUICK, SHAPES
from harness import Table, parser
from torch_sparse_decode.kernels import topk_engine as topk
from torch_sparse_decode.ops.select_candidate_blocks.kernel import block_keys


def phase_cycles(what: str, rows: int, width: int, block_size: int) -> tuple[int, list[float], list[float]]:
    """(cluster size, median cycles of each phase, timeline in us: kernel span, median CTA,
    slowest CTA, last start after the first) for one call on random scores."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn(rows, width, device="cuda", generator=gen)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    src, block, k_sel, pinned = scores, 1, K, False
    if what == "blocks":
        src, block, k_sel, pinned = block_keys(scores, lengths, block_size), block_size, K - 1, True
    ranks = topk.cluster_size(rows, src.shape[1], topk.sm_count(scores.device))
    phases = len(topk.PHASES)
    out = torch.full((rows, k_sel + 1 + ranks * topk.PROFILE_SLOTS), -7, dtype=torch.int32, device="cuda")
    engine = topk.compiled(src.dtype, pinned, ranks, what == "ord16", profile=True)
    none = torch.empty(0, 0, dtype=src.dtype, device="cuda")
    flush = torch.empty(64 << 20, device="cuda")  # 256 MiB: the input is not left in the 60 MB L2
    for _ in range(3):  # the last call's marks, compiled and warm
        flush.zero_()
        engine(src, lengths, lengths, 0, width, block, k_sel, out, out, out, 0, none, 0)  # no windows, ids only
    torch.cuda.synchronize()
    slots = out[:, k_sel + 1:].reshape(rows, ranks, topk.PROFILE_SLOTS).cpu().long()
    ends = slots[..., :phases].double()
    # A phase's cycles: its end minus the latest end before it (phases not taken read 0).
    before = torch.cummax(torch.cat([torch.zeros(rows, ranks, 1, dtype=torch.double), ends[..., :-1]], -1), -1).values
    spent = torch.where(ends > 0, ends - before, torch.zeros_like(ends))
    start, end = slots[..., phases] & 0xFFFFFFFF, slots[..., phases + 1] & 0xFFFFFFFF
    first = start.min()
    start, end = (start - first) % (1 << 32), (end - first) % (1 << 32)  # the timer's low 32 bits may wrap
    cta = (end - start).double()
    timeline = [end.max().item() / 1e3, cta.median().item() / 1e3, cta.max().item() / 1e3, start.max().item() / 1e3]
    return ranks, spent.reshape(rows * ranks, phases).median(dim=0).values.tolist(), timeline


def main() -> None:
    args = parser(__doc__).parse_args()
    timing = "one eager call per shape (the third), after a 256 MiB write that clears L2"
    table = Table(f"Top-k engine phases, k = {K} (SM cycles per CTA, median over rows and CTAs)",
                  ["shape", "CTAs per row", *topk.PHASES, "total"], timing)
    spans = Table(f"Top-k engine timeline, k = {K} (us, global timer)",
                  ["shape", "kernel span", "median CTA", "slowest CTA", "last CTA start"], timing)
    for what, rows, width, block_size in QUICK if args.quick else SHAPES:
        ranks, cycles, timeline = phase_cycles(what, rows, width, block_size)
        shape = f"{what} {rows}x{width >> 10}K" + (f" bs={block_size}" if what == "blocks" else "")
        table.add(shape, ranks, *[round(c) for c in cycles], round(sum(cycles)))
        spans.add(shape, *[round(t, 1) for t in timeline])
    table.emit(args.results)
    spans.emit(args.results)


if __name__ == "__main__":
    main()
