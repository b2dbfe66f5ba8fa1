"""Where the short-row path's time goes (kernels/topk/short_row.py): builds of it with phases cut
out, each timed in CUDA graphs beside the whole kernel (cut builds give wrong ids: timing only).

    python benchmarks/profile_short_row.py [--quick] [--check CASES] [--cuts "NAME;NAME"] [--results FILE]
    python benchmarks/profile_short_row.py --phases [--results FILE]
    python benchmarks/profile_short_row.py --wide [--prebuild] [--results FILE]

``--phases``: the build the op takes at each shape of 8K-128K columns (``short_row.build_for`` on
132 SMs: one CTA, a cluster, or a wide row's cluster), and at 8K the one-CTA build of 1024 threads
too, with phase marks (``ShortRowTopk(profile=True)``, ``short_digits.PHASES``): the median over
rows of the first CTA's thread 0's SM cycles in each phase (0: a phase the row skips), and each
row's span on the global timer beside the call's time in a CUDA graph; what the span leaves out
is the launch and the kernel's drain.

``--wide``: CANDIDATES (changes to the select, as subclasses here) built at the configuration the
op takes at each of WIDE_SHAPES (1-8 rows of 8K-128K columns), each beside the op's build: ids
compared on every input set, then timed. Their objects go to the disk cache like the library's
kernels, keyed by this file, so ``--wide --prebuild`` on a machine without a GPU (with
``CUTE_DSL_ARCH=sm_90a`` and ``TORCH_SPARSE_DECODE_CACHE`` set) spares the GPU their compiles.
The candidate: ``UnrolledRank``, the settling bin's keys ranked with every shuffle unrolled
(at 18cb34f the settle took 9785 of 8 x 128K's 29833 cycles, 2543 of 1 x 8K's 10300). Measured
(H100, 1213a83): no faster anywhere, slower at 8 x 16K-64K (8 x 32K 9.14 against 7.98 us); kept
as the example of a candidate.

Cuts: launch only (the same CTA and shared memory, reading the row's length), read only (the
launch and the row read into registers as the kernel reads it), no tail (all four digit rounds,
no one-warp rank of the last bin), no count (the digit rounds' atomics), no scan (the one-warp
scans), one digit round, no rounds (launch, the reads of the row and its length, and the
output's ballots writing the first k ids). The same cuts of the shipped 8K build (512 threads,
lean): "512 lean, launch only", "read only", "one round", "no rounds". ``--cuts`` times only the
builds named (separated by ";") beside the whole kernel.

Candidates (exact: their ids are checked against the whole kernel's before they are timed; one
that differs reads "wrong" and is not timed):
branch-free count (every key adds live ? 1 : 0, no divergent branch around the atomic); CTAs of
512 threads (the 8K rows' CTA since bfb6d8a); the whole kernel as a programmatic dependent of the
call before it. At 512 threads: the branch-free count; the lean builds' parts
(``short_row.LEAN``, the default): the ties-taken write (where the CTA keeps every key equal to t, one
ballot a key places the keys >= t: 15 SASS instructions a key against the shipped pass's 32),
with the branch-free count, the one-barrier rounds (``short_digits``), and both (lean); the
one-barrier rounds and the lean build at 1024 threads too (the 16K rows' CTA). (Measured and
dropped, H100, 7c4f372: warp sums of the histogram's copies, 11.4 us against 10.7, and with the
branch-free count, 10.7; both at 512 threads, 9.68 against 8.95.) ``--check CASES`` first
compares every candidate's ids with the whole kernel's over seeded adversarial batches
(tests/inputs.py's kinds, k and lengths at the edges, windows).

Static SASS at 9373a8f (sm_90a, fp32): the whole kernel 4296 instructions a thread, 64
registers, 4 bytes spilled, 113 divergent-branch blocks (BSSY); branch-free count 4176 and 49
BSSY. At 14d9966, 512 threads: 4280 instructions, no spill, 113 BSSY; branch-free 4176, 49 BSSY;
ties-taken write 4392 (both passes in the code), 98 BSSY; with the branch-free count 4280, 34
BSSY; one-barrier rounds 4072, 54 registers, 10 barriers in the code against 18; lean 4176.
"""

from __future__ import annotations

import os
import sys

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32
from harness import Table, graph_us, parser, phase_marks, rotation
from torch_sparse_decode.kernels.topk import short_digits, short_row
from torch_sparse_decode.kernels.compile import CachedKernel

K = 2048


class NoCount(short_row.ShortRowTopk):
    @cute.jit
    def count(self, keys, run, t, p: cutlass.Constexpr[int], shift: cutlass.Constexpr[int], hist, tid):
        pass


class NoScan(short_row.ShortRowTopk):
    """The digit is always the middle bin (the scan's sums are still read: ``bin_count``); no tail."""

    def __init__(self, source):
        super().__init__(source)
        self.tail_digits = self.rounds

    @cute.jit
    def digit_round(self, keys, run, t, need, k, p: cutlass.Constexpr[int], hist, parts, info, tid):
        shift = 32 - short_digits.RADIX * (p + 1)
        self.count(keys, run, t, p, shift, hist, tid)
        cute.arch.sync_threads()
        self.sum_copies(hist, parts, tid)
        cute.arch.sync_threads()
        return t | (cutlass.Uint32(short_digits.BINS // 2) << cutlass.Uint32(shift)), need


class LaunchOnly(short_row.ShortRowTopk):
    """The same launch (threads, shared memory) reading only the row's length: the floor of a call."""

    @cute.kernel
    def kernel(self, src, lengths, starts, windowed, cols, block, k, out, raw, table, page, values, want):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        hist = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(short_digits.HIST), 16)
        hist[tid] = lengths[row]
        cute.arch.sync_threads()
        if hist[(tid + 1) % self.threads] == Int32(-12345):  # never: keeps the read
            out[row, 0] = Int32(0)


class ReadOnly(short_row.ShortRowTopk):
    """The launch and one coalesced read of the row into registers, as the kernel reads it."""

    @cute.kernel
    def kernel(self, src, lengths, starts, windowed, cols, block, k, out, raw, table, page, values, want):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane, warp = tid % 32, tid // 32
        span = min(cols, src.shape[1])
        run = (span + self.threads - 1) // self.threads
        lo = warp * 32 * run + lane
        seen = Uint32(0)
        for i in cutlass.range_constexpr(self.per):
            x = src[row, min(lo + 32 * i, span - 1)]
            seen = seen ^ cutlass.select_(run > i, short_row.source_key(x, self.source, False), Uint32(0))
        if (seen == Uint32(0x12345)) & (lengths[row] == Int32(-12345)):  # never: keeps the reads
            out[row, 0] = Int32(0)


class BranchFreeCount(short_row.ShortRowTopk):
    @cute.jit
    def count(self, keys, run, t, p: cutlass.Constexpr[int], shift: cutlass.Constexpr[int], hist, tid):
        lane = tid % 32
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                key = keys[i]
                live = key != Uint32(0)
                if cutlass.const_expr(p > 0):
                    live = live & ((key >> Uint32(shift + short_digits.RADIX)) ==
                                   (t >> Uint32(shift + short_digits.RADIX)))
                b = Int32((key >> Uint32(shift)) & Uint32(short_digits.BINS - 1))
                cute.arch.atomic_add(hist.iterator + (b * 32 + lane), cutlass.select_(live, Int32(1), Int32(0)))


class UnrolledRank(short_row.ShortRowTopk):
    """Candidate: a cluster's settling bin ranked with every shuffle unrolled (``count_at_least``
    loops over the m keys one at a time, each step waiting on its shuffle: at 128K a randn row's ~80
    keys cost ~2800 cycles). A lane's slots past m hold 0 (no key): never >= a key, never picked."""

    @cute.jit
    def count_at_least(self, held: cute.Tensor, at_least: cute.Tensor, m: Int32, slots: cutlass.Constexpr[int]):
        for g in cutlass.range_constexpr(slots):
            if m > 32 * g:  # warp-uniform
                for j in cutlass.range_constexpr(32):
                    v = Uint32(cute.arch.shuffle_sync(Int32(held[g]), j))
                    for h in cutlass.range_constexpr(slots):
                        at_least[h] = at_least[h] + cutlass.select_(v >= held[h], Int32(1), Int32(0))


def with_threads(cls, threads: int, pdl: bool = False, one_barrier: bool = False, ties_taken: bool = False,
                 per: int = short_digits.PER, trim: bool = False, ctas: int = 1):
    """``cls`` in CTAs of ``threads`` holding ``per`` keys a thread (rows of at most threads * per keys), a
    programmatic dependent if ``pdl``, with the lean builds' ``one_barrier`` rounds and ``ties_taken`` write
    (``short_row.LEAN``) and their ``trim`` (``short_row.TRIM``) as asked, a row over a cluster of ``ctas``."""

    class Sized(cls):
        def __init__(self, source):
            super().__init__(source)
            self.threads, self.warps, self.parts = threads, threads // 32, max(1, threads // short_digits.BINS)
            self.pdl, self.one_barrier, self.ties_taken, self.per, self.trim = pdl, one_barrier, ties_taken, per, trim
            self.ctas = ctas

    return Sized


def variant(digits: int, tail_digits: int | None = None):
    """``digits`` rounds; the tail after ``tail_digits`` of them (None: as shipped; digits: none)."""

    class Variant(short_row.ShortRowTopk):
        def __init__(self, source):
            super().__init__(source)
            self.rounds = digits
            self.tail_digits = self.tail_digits if tail_digits is None else tail_digits

    return Variant


CUTS = {"whole": short_row.ShortRowTopk, "launch only": LaunchOnly, "read only": ReadOnly,
        "no tail": variant(4, 4), "no count": NoCount,
        "no scan": NoScan, "one round": variant(1), "no rounds": variant(0),
        "branch-free count": BranchFreeCount,
        "512 threads": with_threads(short_row.ShortRowTopk, short_row.HALF),
        "pdl": with_threads(short_row.ShortRowTopk, short_row.THREADS, pdl=True),
        "512, branch-free": with_threads(BranchFreeCount, short_row.HALF),
        "512, ties-taken write": with_threads(short_row.ShortRowTopk, short_row.HALF, ties_taken=True),
        "512, both new": with_threads(BranchFreeCount, short_row.HALF, ties_taken=True),
        "one-barrier rounds": with_threads(short_row.ShortRowTopk, short_row.THREADS, one_barrier=True),
        "512, one-barrier rounds": with_threads(short_row.ShortRowTopk, short_row.HALF, one_barrier=True),
        "512, lean": with_threads(short_row.ShortRowTopk, short_row.HALF, one_barrier=True, ties_taken=True),
        "lean": with_threads(short_row.ShortRowTopk, short_row.THREADS, one_barrier=True, ties_taken=True),
        # the shipped 8K build's (512 threads, lean) frame: what its select and write add to the read
        "512 lean, launch only": with_threads(LaunchOnly, short_row.HALF, one_barrier=True, ties_taken=True),
        "512 lean, read only": with_threads(ReadOnly, short_row.HALF, one_barrier=True, ties_taken=True),
        "512 lean, one round": with_threads(variant(1), short_row.HALF, one_barrier=True, ties_taken=True),
        "512 lean, no rounds": with_threads(variant(0), short_row.HALF, one_barrier=True, ties_taken=True),
        # fewer warps a row, more keys a thread: each warp's share of the rounds' scans, the rank and the
        # barriers is paid by fewer warps (the 8K build is bound by its SM's issue: 256 x 8K takes 1.6x 1 x 8K)
        "256 x 32 lean": with_threads(short_row.ShortRowTopk, 256, one_barrier=True, ties_taken=True, per=32),
        "128 x 64 lean": with_threads(short_row.ShortRowTopk, 128, one_barrier=True, ties_taken=True, per=64),
        "512, trim": with_threads(short_row.ShortRowTopk, short_row.HALF, one_barrier=True, ties_taken=True, trim=True),
        "256 x 32 trim": with_threads(short_row.ShortRowTopk, 256, one_barrier=True, ties_taken=True, per=32,
                                      trim=True),
        # the 16K rows' CTA (1024 threads, plain) against half the warps holding twice the keys, trimmed
        "512 x 32 trim": with_threads(short_row.ShortRowTopk, short_row.HALF, one_barrier=True, ties_taken=True,
                                      per=32, trim=True),
        # a row over a cluster of CTAs (each its share of the keys, the histograms summed over the cluster)
        "C2 x 256 trim": with_threads(short_row.ShortRowTopk, 256, one_barrier=True, ties_taken=True, trim=True,
                                      ctas=2),
        "C4 x 128 trim": with_threads(short_row.ShortRowTopk, 128, one_barrier=True, ties_taken=True, trim=True,
                                      ctas=4),
        "C4 x 256 x 8 trim": with_threads(short_row.ShortRowTopk, 256, one_barrier=True, ties_taken=True, per=8,
                                          trim=True, ctas=4),
        # twice the CTAs a row (the portable cluster's most): a fourth of an 8K row's rounds and write a warp
        "C8 x 64 trim": with_threads(short_row.ShortRowTopk, 64, one_barrier=True, ties_taken=True, trim=True,
                                     ctas=8),
        "C8 x 128 x 8 trim": with_threads(short_row.ShortRowTopk, 128, one_barrier=True, ties_taken=True, per=8,
                                          trim=True, ctas=8)}
# candidates: checked against the whole kernel's ids
EXACT = ("branch-free count", "512 threads", "pdl", "512, branch-free", "512, ties-taken write", "512, both new",
         "one-barrier rounds", "512, one-barrier rounds", "512, lean", "lean", "256 x 32 lean", "128 x 64 lean",
         "512, trim", "256 x 32 trim", "512 x 32 trim", "C2 x 256 trim", "C4 x 128 trim", "C4 x 256 x 8 trim",
         "C8 x 64 trim", "C8 x 128 x 8 trim")


def inputs(kind: str, rows: int, width: int):
    """``make(seed)`` for rotation: fp32 rows of ``kind`` (randn, or ties: four values), full length."""

    def make(seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.randn(rows, width, device="cuda", generator=gen) if kind == "randn" else
             torch.randint(0, 4, (rows, width), device="cuda", generator=gen).float())
        return x, torch.full((rows,), width, dtype=torch.int32, device="cuda")

    return make


PHASE_SHAPES = [(1, 8 << 10), (8, 8 << 10), (64, 8 << 10), (256, 8 << 10), (8, 16 << 10), (8, 32 << 10),
                (8, 64 << 10), (1, 128 << 10), (8, 128 << 10)]


def op_build(rows: int, width: int) -> tuple | None:
    """The build ``indexer_topk`` takes for fp32 rows of ``width`` (``short_row.build_for`` on an
    H100's or H200's 132 SMs; None: the engine)."""
    return short_row.build_for(torch.float32, False, width, rows, 132, False, False)


def build_label(config: tuple) -> str:
    """A build's CTA shape: threads, or a cluster's CTAs x threads."""
    return f"{config[7]} x {config[2]}" if len(config) > 7 else str(config[2])


def phase_builds(rows: int, width: int) -> list[tuple]:
    """``--phases``' builds of a shape: the op's (``op_build``), and at 8K columns the one-CTA build
    of THREADS too."""
    built = [op_build(rows, width)]
    if width <= short_row.HALF * short_digits.PER:
        built.append((torch.float32, False, short_row.THREADS, False, False, short_row.lean_for(short_row.THREADS),
                      short_row.trim_for(short_row.THREADS)))
    return [c for c in built if c is not None]


def phases(results: str | None) -> None:
    """The phase-marked builds' cycles and timeline (``--phases``)."""
    names = short_digits.PHASES
    timing = "marks: one eager call per shape (the third), after a 256 MiB write that clears L2; call: " + \
        "per call in a CUDA graph (harness.graph_us), inputs rotated"
    table = Table(f"short-row select phases, k = {K}, fp32 (thread 0's SM cycles, median over rows)",
                  ["shape", "rows", "threads", *names, "total"], timing)
    spans = Table(f"short-row select timeline, k = {K}, fp32 (us: global timer, and the call in a graph)",
                  ["shape", "rows", "threads", "kernel span", "median CTA", "slowest CTA", "last CTA start",
                   "call"], timing)
    flush = torch.empty(64 << 20, device="cuda")
    for rows, width in PHASE_SHAPES:
        for config in phase_builds(rows, width):
            threads = build_label(config)
            profiled = short_row.compiled(*config, profile=True)
            plain = short_row.compiled(*config)
            for kind in ("randn", "ties"):
                sets = rotation(inputs(kind, rows, width), rows * width * 4)
                out = torch.full((rows, K + 1 + len(names) + 2), -7, dtype=torch.int32, device="cuda")
                x, n = sets[0]
                for _ in range(3):  # the last call's marks, compiled and warm
                    flush.zero_()
                    profiled(x, n, n, 0, width, 1, K, out, out, out, 0, x, 0)
                torch.cuda.synchronize()
                cycles, timeline = phase_marks(out[:, K + 1:].cpu(), len(names))
                ids = out[:, :K].clone()
                out[:, :K] = -7
                plain(x, n, n, 0, width, 1, K, out, out, out, 0, x, 0)
                assert torch.equal(out[:, :K], ids), "the profiled build's ids differ from the plain build's"

                def call(i, sets=sets, out=out, width=width, plain=plain):
                    x, n = sets[i % len(sets)]
                    plain(x, n, n, 0, width, 1, K, out, out, out, 0, x, 0)

                shape = f"{rows}x{width >> 10}K"
                table.add(shape, kind, threads, *[round(c) for c in cycles], round(sum(cycles)))
                spans.add(shape, kind, threads, *[round(t, 2) for t in timeline], graph_us(call))
    table.emit(results)
    spans.emit(results)


# ``--wide``: candidate changes to the op's own builds (one CTA, clusters, the wide rows), each built
# at the configuration the op takes for a shape (``op_build``) and cached on
# disk like the library's kernels (prebuilt with ``--wide --prebuild`` on a machine without a GPU).
CANDIDATES = {"unrolled rank": UnrolledRank}
WIDE_SHAPES = [(1, 8 << 10), (8, 8 << 10), (8, 16 << 10), (8, 32 << 10), (8, 64 << 10), (1, 128 << 10),
               (8, 128 << 10)]


def _candidate(name: str, source: torch.dtype, pdl: bool, threads: int, ord16: bool, fused: bool, lean: bool,
               trim: bool, ctas: int = 1):
    topk = CANDIDATES[name](source, pdl, threads, ord16, fused, one_barrier=lean, ties_taken=lean, trim=trim, ctas=ctas)
    return short_row.build(topk, source)


candidate = CachedKernel("profile_short_row_candidate", _candidate, lambda target: ())


def wide(results: str | None, prebuild: bool) -> None:
    """``--wide``: each candidate beside the op's build at WIDE_SHAPES, ids checked on every input
    set first (a candidate whose ids differ reads "wrong" and is not timed)."""
    configs = {shape: op_build(*shape) for shape in WIDE_SHAPES}
    if prebuild:
        for config in dict.fromkeys(configs.values()):
            for name in CANDIDATES:
                candidate(name, *config)
        return
    table = Table(f"short-row select: candidates beside the op's build (us), k = {K}, fp32",
                  ["shape", "rows", "build", "op's build", *CANDIDATES])
    for (rows, width), config in configs.items():
        builds = {"op": short_row.compiled(*config), **{name: candidate(name, *config) for name in CANDIDATES}}
        for kind in ("randn", "ties"):
            sets = rotation(inputs(kind, rows, width), rows * width * 4)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")

            def call(f, i, sets=sets, out=out, width=width):
                x, n = sets[i % len(sets)]
                f(x, n, n, 0, width, 1, K, out, out, out, 0, x, 0)

            want = []
            for i in range(len(sets)):
                call(builds["op"], i)
                want.append(out.clone())
            cells = []
            for name, f in builds.items():
                same = True
                for i in range(len(sets)):
                    out.fill_(-7)
                    call(f, i)
                    same = same and torch.equal(out, want[i])
                cells.append(graph_us(lambda i, f=f: call(f, i)) if same else "wrong")
            table.add(f"{rows}x{width >> 10}K", kind, build_label(config), *cells)
    table.emit(results)


def check(cases: int, made: dict, kernels: dict, exact: list, device: str = "cuda") -> set:
    """``--check``: each candidate's ids against the whole kernel's on ``cases`` seeded batches of
    tests/inputs.py's kinds (ties, NaN, +-inf, -0.0, plateaus), widths of 1-16K, k of 1-4096,
    lengths at k - 1, k, k + 1, 0 and the width, windows half the time; the candidates that
    differed."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))
    from inputs import KINDS, scores

    gen = torch.Generator().manual_seed(1)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    differed = {name: 0 for name in exact}
    for case in range(cases):
        rows, width = pick((1, 3, 8, 64, 200)), pick((1, 2, 31, 1000, 2049, 4096, 5000, 8191, 8192, 12000, 16384))
        k = pick((1, 2, 7, 64, 512, 2048, 4096, max(width - 1, 1), width, width + 1))
        src = scores(pick(KINDS), (rows, width), seed=case).to(device)
        lengths = torch.tensor([pick((0, 1, k - 1, k, k + 1, width, int(torch.randint(width + 1, (1,), generator=gen))))
                                for _ in range(rows)], dtype=torch.int32).clamp(0, width)
        windowed = case % 2
        starts = (torch.rand(rows, generator=gen) * lengths).int().to(device) if windowed else lengths.to(device)
        lengths = lengths.to(device)
        outs = {}
        for name in ("whole", *exact):
            f = kernels[name]
            if width <= made[name].threads * made[name].per * made[name].ctas:
                out = torch.full((rows, k), -7, dtype=torch.int32, device=device)
                f(src, lengths, starts, windowed, width, 1, k, out, out, out, 0, src, 0)
                outs[name] = out
        for name in exact:
            if name in outs and not torch.equal(outs[name], outs["whole"]):
                differed[name] += 1
                print(f"{name}: differs at case {case} ({rows}x{width}, k={k})", flush=True)
    print(f"checked {cases} batches: " + ", ".join(f"{name} {n} differed" for name, n in differed.items()))
    return {name for name, n in differed.items() if n}


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--phases", action="store_true", help="the phase-marked builds' cycles and timeline")
    cli.add_argument("--check", type=int, default=0, metavar="CASES",
                     help="first the candidates' ids against the whole kernel's on CASES seeded batches (those "
                          "that differ are not timed; exit 1)")
    cli.add_argument("--cuts", default="", metavar="NAMES",
                     help="only these builds (names of CUTS, separated by ;) beside the whole kernel")
    cli.add_argument("--wide", action="store_true", help="CANDIDATES beside the op's builds at 8K-128K columns")
    cli.add_argument("--prebuild", action="store_true", help="with --wide: only compile the candidates (no GPU)")
    args = cli.parse_args()
    if args.phases:
        return phases(args.results)
    if args.wide:
        return wide(args.results, args.prebuild)
    chosen = {"whole", *args.cuts.split(";")} if args.cuts else set(CUTS)
    if chosen - set(CUTS):
        cli.error(f"--cuts: no such build: {', '.join(sorted(chosen - set(CUTS)))}")
    cuts = {name: cls for name, cls in CUTS.items() if name in chosen}
    table = Table(f"short-row path with phases cut out (us), k={K}, fp32", ["shape", "rows", *cuts])
    made = {name: cls(torch.float32) for name, cls in cuts.items()}
    kernels = {name: short_row.build(topk, torch.float32) for name, topk in made.items()}
    exact = [name for name in EXACT if name in made]
    failed = check(args.check, made, kernels, exact) if args.check else set()
    for rows, width in [(1, 8 << 10), (8, 8 << 10)] + ([] if args.quick else [(64, 8 << 10), (256, 8 << 10),
                                                                             (8, 16 << 10)]):
        for kind in ("randn", "ties"):
            sets = rotation(inputs(kind, rows, width), rows * width * 4)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")

            def call(f, i):
                x, n = sets[i % len(sets)]
                f(x, n, n, 0, width, 1, K, out, out, out, 0, x, 0)

            fits = {name: width <= made[name].threads * made[name].per * made[name].ctas for name in made}
            call(kernels["whole"], 0)
            want = out.clone()
            wrong = set(failed)  # candidates whose ids differ from the whole kernel's: not timed
            for name in exact:
                if fits[name]:
                    out.fill_(-7)
                    call(kernels[name], 0)
                    if not torch.equal(out, want):
                        wrong.add(name)
                        print(f"{name}: ids differ from the whole kernel's at {rows}x{width >> 10}K {kind}", flush=True)
            times = ["wrong" if name in wrong else graph_us(lambda i, f=f: call(f, i)) if fits[name] else "-"
                     for name, f in kernels.items()]
            table.add(f"{rows}x{width >> 10}K", kind, *times)
    table.emit(args.results)
    if failed:
        raise SystemExit(f"differed from the whole kernel: {', '.join(sorted(failed))}")


if __name__ == "__main__":
    main()
