"""Where the top-k engine's cycles go: a build with phase marks (``RadixTopk(profile=True)``,
``kernels/topk``'s PHASES) stamps the SM clock at the end of each phase; this prints, per shape,
the median over rows and CTAs of each phase's cycles. Phases a shape does not take read 0. ncu
has no counters on our machines; this is the profiler.

    python benchmarks/profile_topk.py [--quick | --fused | --ties [--width K]] [--results FILE]

``--fused``: plain ``indexer_topk`` rows beside the fused build with every output (KV slots
through a page table of 64-token pages, raw ids, values), at 8x128K and 64x128K. ``--ties``:
token rows at 8x128K and 64x128K in each of ``bench_topk_ties.py``'s distributions (``--width 1024``:
at 8x1M and 64x1M).

Cycles, not microseconds (the SM clock ran at 1980 MHz under this load, by nvidia-smi). A second
table reads the global timer each CTA stamps at its start and end: the kernel's span from the
first CTA's start to the last one's end, against the median and slowest CTA, shows how much of a
call is spent outside the median CTA's phases (late starts, slow CTAs).
"""

from __future__ import annotations

import torch

from bench_topk_ties import DISTRIBUTIONS, distribution
from compare_topk import K, QUICK, SHAPES
from harness import Table, parser, phase_marks
from torch_sparse_decode.kernels import topk
from torch_sparse_decode.ops.select_candidate_blocks.kernel import block_keys


def phase_cycles(what: str, rows: int, width: int, block_size: int, dist: str = "randn"
                 ) -> tuple[int, list[float], list[float]]:
    """(cluster size, median cycles of each phase, timeline in us: kernel span, median CTA,
    slowest CTA, last start after the first) for one call on scores of distribution ``dist``."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    scores = distribution(dist, rows, width, gen)
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    src, block, k_sel, pinned = scores, 1, K, False
    if what == "blocks":
        src, block, k_sel, pinned = block_keys(scores, lengths, block_size), block_size, K - 1, True
    ranks = topk.cluster_size(rows, src.shape[1], topk.sm_count(scores.device))
    phases = len(topk.PHASES)
    out = torch.full((rows, k_sel + 1 + ranks * topk.PROFILE_SLOTS), -7, dtype=torch.int32, device="cuda")
    fused = what == "fused"
    engine = topk.compiled(src.dtype, pinned, ranks, what == "ord16", profile=True, fused=fused)
    raw, table, page, values, want = out, out, 0, torch.empty(0, 0, dtype=src.dtype, device="cuda"), 0
    if fused:  # every output; raw and values as wide as out (the engine bounds writes by out's width)
        raw, values, page, want = torch.empty_like(out), torch.empty(out.shape, dtype=src.dtype, device="cuda"), 64, 3
        table = torch.randperm(rows * width // page, device="cuda", generator=gen).int().view(rows, width // page)
    flush = torch.empty(64 << 20, device="cuda")  # 256 MiB: the input is not left in the 60 MB L2
    for _ in range(3):  # the last call's marks, compiled and warm
        flush.zero_()
        engine(src, lengths, lengths, 0, width, block, k_sel, out, raw, table, page, values, want)  # no windows
    torch.cuda.synchronize()
    spent, timeline = phase_marks(out[:, k_sel + 1:].cpu(), phases)
    return ranks, spent, timeline


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--fused", action="store_true", help="plain beside fused (every output) rows at 128K")
    cli.add_argument("--ties", action="store_true", help="token rows at 128K in each tie-heavy distribution")
    cli.add_argument("--width", type=int, default=128, help="--ties: the rows' width, in K columns")
    args = cli.parse_args()
    timing = "one eager call per shape (the third), after a 256 MiB write that clears L2"
    table = Table(f"Top-k engine phases, k = {K} (SM cycles per CTA, median over rows and CTAs)",
                  ["shape", "CTAs per row", *topk.PHASES, "total"], timing)
    spans = Table(f"Top-k engine timeline, k = {K} (us, global timer)",
                  ["shape", "kernel span", "median CTA", "slowest CTA", "last CTA start"], timing)
    shapes = [(*shape, "randn") for shape in (QUICK if args.quick else SHAPES)]
    if args.fused:
        shapes = [(what, rows, 128 << 10, 1, "randn") for rows in (8, 64) for what in ("tokens", "fused")]
    if args.ties:
        shapes = [("tokens", rows, args.width << 10, 1, dist) for rows in (8, 64) for dist in DISTRIBUTIONS]
    for what, rows, width, block_size, dist in shapes:
        ranks, cycles, timeline = phase_cycles(what, rows, width, block_size, dist)
        shape = f"{what} {rows}x{width >> 10}K" + (f" bs={block_size}" if what == "blocks" else "") + \
            ("" if dist == "randn" else f", {dist}")
        table.add(shape, ranks, *[round(c) for c in cycles], round(sum(cycles)))
        spans.add(shape, *[round(t, 1) for t in timeline])
    table.emit(args.results)
    spans.emit(args.results)


if __name__ == "__main__":
    main()
