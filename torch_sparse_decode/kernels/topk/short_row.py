"""The short-row select (CuTe DSL): the top-k of a row whose window holds at most SHORT_MAX keys,
in one CTA, with no cluster, ring or copy. Every user of the engine takes it for such rows:
scores (``indexer_topk``, ``indexer_topk_fused``), block keys with the newest block pinned
(``select_candidate_blocks`` and its fused form) and the DCP pack's ord16 keys.

- One CTA per row: HALF threads where the batch's key columns fit them, THREADS where not
  (``threads_for``). The batch's key columns are split into one contiguous run a warp of
  32 * ceil(columns / threads) <= 32 * PER, its lanes side by side (coalesced loads), read once
  into registers: scores while the row's length is read (then masked to the window), block
  keys after it (only a row's valid blocks are written). Id order is warp, then key, then lane.
- t, the k-th largest key: ``short_digits`` (8-bit digits, settled early where the bin allows).
  bf16 and fp16 scores widen to fp32 with their low 16 / 8 bits fixed by the sign, so two and
  three digits; ord16 keys take two, block keys four.
- Output (``short_write``): each warp counts its keys > t and == t by ballots; one barrier gives each warp the
  counts of the warps below, and each key's ballots its place among its warp's: a key > t at
  (keys > t before it) + min(ties before it, ties taken), a tie iff fewer than ``take`` ties
  precede it. Ids come out ascending, ties to the lowest ids, with no sort; nothing is written
  outside the outputs. A fused build writes each id through ``output.emit`` (the KV slot or
  block through the table, the raw id, the score read back from the row).
- A row of at most k keys keeps them all (every valid id, then -1), as the engine does; block
  keys put the newest block after the kept ones.

Lean builds (``LEAN``, the default for CTAs of 512 threads, ``lean_for``;
TORCH_SPARSE_DECODE_SHORT_LEAN=0 takes the plain ones everywhere): digit
rounds of one barrier (``short_digits``), and where the CTA keeps every key equal to t, the
output's second pass as one ballot a key over the keys >= t (``write_at_least``): 8.47 against
9.66 us at 1 x 8K, 13.7 against 14.2 at 256 x 8K (H100; benchmarks/RESULTS.md).

The ops take it where ``launch.select`` finds the batch's key columns <= SHORT_MAX (a shape test:
graph-safe, and both paths are exact, so a row's ids never depend on the other rows), unless
``SHORT_ROWS`` is off (TORCH_SPARSE_DECODE_SHORT_ROWS=0). Its times: docs/topk_engine.md.
"""

from __future__ import annotations

import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from ...dtypes import BLOCK_KEYS, DCP_SCORES, TOPK_SCORES, cute_type
from ...limits import TOPK_MAX_K
from .. import pdl
from ..compile import cached_kernel, fake_stream, fake_tensor
from ..cute import begin_marks, zero_fill
from .keys import source_key
from .output import Outputs, emit
from .short_digits import BINS, DIGIT_ROUNDS, GATHERED, HIST, PER, PHASES, TAIL, TAIL_DIGITS, ShortDigits
from .short_write import ShortWrite

# On by default (faster than the engine at every shape it takes; docs/topk_engine.md);
# TORCH_SPARSE_DECODE_SHORT_ROWS=0 sends every batch to the engine.
SHORT_ROWS = os.environ.get("TORCH_SPARSE_DECODE_SHORT_ROWS", "1") != "0"
# On by default (TORCH_SPARSE_DECODE_SHORT_LEAN=0: the plain builds): the lean builds, rounds of one
# barrier (``short_digits``) and the ties-taken write (``write_kept``). Read at each launch.
LEAN = os.environ.get("TORCH_SPARSE_DECODE_SHORT_LEAN", "1") == "1"
# On by default (TORCH_SPARSE_DECODE_SHORT_TRIM=0: off): the lean builds trimmed
# (``ShortRowTopk(trim=True)``): fewer instructions a key where the SM's issue binds them (H200: 5.82
# against 7.76 us at 1 x 8K, 10.5 against 13.2 at 256 x 8K; docs/topk_engine.md).
TRIM = os.environ.get("TORCH_SPARSE_DECODE_SHORT_TRIM", "1") == "1"
# On by default, with TRIM (TORCH_SPARSE_DECODE_SHORT_CLUSTER=0: off): a batch of few rows spreads each
# row over a cluster of C CTAs of threads_for(columns) // C threads (``ShortRowTopk(ctas=C)``), so one
# row's select is not bound by one SM's issue (H200: 6.17 against 13.4 us at 1 x 16K, 5.50 against 5.82
# trimmed at 1 x 8K).
CLUSTER = os.environ.get("TORCH_SPARSE_DECODE_SHORT_CLUSTER", "1") == "1"
CLUSTER_SIZES = (4, 2)  # the largest whose CTAs all fit the GPU at once
# On by default, with CLUSTER (TORCH_SPARSE_DECODE_SHORT_WIDE=0: off): batches of rows of more than
# SHORT_MAX key columns, up to WIDE_MAX, whose rows' clusters all fit the SMs at once (``wide_build``),
# where the engine takes its fixed chain of digit searches through the ring (H100: 8.55 against 14.1 us
# at 8 x 32K, 16.0 against 17.3 at 1 x 128K, the DCP pack's 64K keys 14.0 against 20.3).
WIDE = os.environ.get("TORCH_SPARSE_DECODE_SHORT_WIDE", "1") != "0"

THREADS = 1024
SHORT_MAX = THREADS * PER  # the most key columns the path takes
# Rows whose keys fit HALF threads take CTAs of HALF threads: half the warps at each barrier and
# histogram sum (H100, 1 x 8K: 8.9 us against 10.7 at THREADS), and two fit an SM (64 registers a
# thread), so past the SMs one CTA's barriers and one-warp scans hide under the other's work.
HALF = THREADS // 2
# A wide row's (CTAs, threads a CTA), the first that holds the row and fits: a CTA's share of the row
# bounds its time (H100: 9.95 us at 8 x 32K over 4 CTAs of 512 threads, 16.6 at 8 x 128K over 8 of
# 1024), so the most CTAs first; 8 is the portable cluster's most, and CTAs of THREADS fill an SM.
# Clusters of 16 (non-portable) measured slower at every width: 12.9 against 7.80 us at 8 x 32K,
# 21.4 against 15.3 at 1 x 128K (H100, benchmarks/probe_wide_clusters.py).
WIDE_BUILDS = ((8, THREADS // 4), (4, HALF), (2, THREADS), (8, HALF), (8, THREADS))
WIDE_MAX = WIDE_BUILDS[-1][0] * WIDE_BUILDS[-1][1] * PER
# On by default (TORCH_SPARSE_DECODE_SHORT_PAIRS=0: off): PAIR takes 34-66 rows of 32K key columns,
# which take the engine without it (H100, 64 x 32K: 14.8-14.9 us against the engine's 18.0-18.1, and
# 14.0-14.4 against 16.2-16.3 on all-equal rows; 34 x 32K 13.8 against 17.1). Read at each launch.
PAIRS = os.environ.get("TORCH_SPARSE_DECODE_SHORT_PAIRS", "1") != "0"
PAIR = (2, THREADS)


def wide_builds() -> tuple[tuple[int, int], ...]:
    """The WIDE_BUILDS a batch may take: PAIR only where ``PAIRS``."""
    return tuple(b for b in WIDE_BUILDS if PAIRS or b != PAIR)


def threads_for(key_cols: int) -> int:
    """A CTA's threads for a batch of ``key_cols`` key columns (a shape test: the same in every replay)."""
    return HALF if key_cols <= HALF * PER else THREADS


def lean_for(threads: int) -> bool:
    """Whether CTAs of ``threads`` take the lean build: where ``LEAN`` and they measured faster, at
    512 threads (1 x 8K: 7.84 against 8.96 us randn, 8.57 against 8.79 ties); at 1024 they were
    not (11.0 against 11.0 randn, 11.8 against 11.2 ties; H100, profile_short_row.py)."""
    return LEAN and threads == HALF


def trim_for(threads: int) -> bool:
    """Whether CTAs of ``threads`` take the trimmed lean build (``TRIM``)."""
    return TRIM and lean_for(threads)


def clusters_for(fused: bool) -> bool:
    """Whether a batch may spread its rows over clusters (``CLUSTER``): trimmed builds, ids alone
    (a shape test)."""
    return CLUSTER and not fused and trim_for(HALF)


def widest(fused: bool) -> int:
    """The most key columns a batch may have to take this path: WIDE_MAX where wide rows are on
    (``WIDE``, with the clusters), else SHORT_MAX."""
    return WIDE_MAX if WIDE and clusters_for(fused) else SHORT_MAX


def wide_build(key_cols: int, rows: int, sms: int) -> tuple[int, int] | None:
    """(CTAs, threads a CTA) for a batch of ``rows`` rows of ``key_cols`` > SHORT_MAX key columns:
    the first of ``wide_builds`` that holds the row and whose rows * CTAs fit ``sms`` SMs, else None
    (the engine: a CTA's share of a row past one wave measured slower than the engine). A shape
    test, the same in every replay; both paths are exact, so a row's ids never depend on it."""
    return next(((c, t) for c, t in wide_builds() if key_cols <= c * t * PER and rows * c <= sms), None)


def build_for(source: torch.dtype, pdl: bool, key_cols: int, rows: int, sms: int, ord16: bool,
              fused: bool) -> tuple | None:
    """``compiled``'s configuration for a batch of at most ``widest`` key columns (a shape test): a
    wide row's cluster (``wide_build``; None where none fits: the engine); rows spread over a
    cluster of ``cluster_size`` CTAs where ``clusters_for``; else one CTA of ``threads_for``
    threads a row, lean and trimmed as those say."""
    if key_cols > SHORT_MAX:
        wide = wide_build(key_cols, rows, sms)
        return None if wide is None else cluster_config(source, pdl, wide[1], ord16, wide[0])
    threads = threads_for(key_cols)
    ctas = cluster_size(rows, sms) if clusters_for(fused) else 1
    if ctas > 1:
        return cluster_config(source, pdl, threads // ctas, ord16, ctas)
    return (source, pdl, threads, ord16, fused, lean_for(threads), trim_for(threads))


def cluster_config(source: torch.dtype, pdl: bool, threads: int, ord16: bool, ctas: int) -> tuple:
    """``compiled``'s configuration of a row over a cluster of ``ctas`` CTAs of ``threads``: the
    trimmed lean build, ids alone."""
    return (source, pdl, threads, ord16, False, True, True, ctas)


def cluster_size(rows: int, sms: int) -> int:
    """CTAs a row: the largest of CLUSTER_SIZES whose rows * CTAs fit ``sms`` SMs, else 1."""
    return next((c for c in CLUSTER_SIZES if rows * c <= sms), 1)


class ShortRowTopk(ShortDigits, ShortWrite):
    """The short-row select for one source (a score dtype, or int32 block keys: ``pinned``), in
    CTAs of ``threads`` (THREADS or HALF); ``ord16``: scores ranked by their bf16 ord16 (the DCP
    pack); ``fused``: ids written through ``Outputs``; ``pdl``: launched as a programmatic
    dependent of the kernel before (``kernels/pdl.py``); ``profile``: a row of more than k keys
    writes its phases' clocks after its k ids (``write_marks``; benchmarks/profile_short_row.py);
    ``one_barrier``: digit rounds of one barrier (``short_digits``); ``ties_taken``: where the CTA
    keeps every key equal to t, one ballot a key places the keys >= t (``write_kept``); ``per``: the
    keys a thread holds at most (rows of at most threads * per keys); ``trim`` (lean builds only):
    a row of exactly threads * run columns, all valid, is not masked; only the three histograms
    the rounds use are cleared; a batch whose threads hold per keys each (8K columns at 512
    threads) takes a copy of the select that tests no key against run; where the search finds
    every tie kept (``short_digits``), one ballot a key both counts and places the keys >= t
    (``write_placed``)."""

    def __init__(self, source: torch.dtype, pdl: bool = False, threads: int = THREADS, ord16: bool = False,
                 fused: bool = False, profile: bool = False, one_barrier: bool = False, ties_taken: bool = False,
                 per: int = PER, trim: bool = False, ctas: int = 1):
        self.source = cute_type(source)
        self.pinned = source is BLOCK_KEYS
        self.ord16 = ord16
        self.fused = fused
        self.rounds = 2 if ord16 else DIGIT_ROUNDS[source]
        self.fill = not ord16  # the low bits of a widened score's key follow from its sign; ord16's are 0
        self.tail_digits = TAIL_DIGITS
        self.pdl = pdl
        self.threads = threads
        self.warps = threads // 32
        self.parts = max(1, threads // BINS)  # the copies are summed in parts groups of 32 // parts
        self.per = per
        assert one_barrier or threads >= BINS, "the plain rounds sum the histogram's copies over BINS threads at least"
        assert not trim or (one_barrier and ties_taken), "trim trims the lean builds"
        assert ctas == 1 or (trim and not fused), "a cluster a row: trimmed builds that write ids alone"
        self.trim = trim
        self.ctas = ctas
        self.profile = profile
        self.one_barrier = one_barrier
        self.ties_taken = ties_taken

    @cute.jit  # HALF CTAs: two an SM, so 64 registers a thread (the carveout: shared memory first)
    def __call__(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
                 block: Int32, k: Int32, out: cute.Tensor, raw: cute.Tensor, table: cute.Tensor, page: Int32,
                 values: cute.Tensor, want: Int32, stream):
        if cutlass.const_expr(self.ctas > 1):  # a row's CTAs are a cluster: rank in x, row in y
            self.kernel(src, lengths, starts, windowed, cols, block, k, out, raw, table, page, values, want).launch(
                grid=[self.ctas, out.shape[0], 1], block=[self.threads, 1, 1], cluster=[self.ctas, 1, 1],
                stream=stream, use_pdl=self.pdl)
        else:
            self.kernel(src, lengths, starts, windowed, cols, block, k, out, raw, table, page, values, want).launch(
                grid=[out.shape[0], 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=self.pdl,
                **({"min_blocks_per_mp": 2, "preferred_smem_carveout": 100} if self.threads == HALF and self.per <= PER
                   else {}))

    @cute.kernel
    def kernel(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
               block: Int32, k: Int32, out: cute.Tensor, raw: cute.Tensor, table: cute.Tensor, page: Int32,
               values: cute.Tensor, want: Int32):
        tid, _, _ = cute.arch.thread_idx()
        rank = Int32(0)  # a cluster's CTA: its share of the row's keys (ctas > 1)
        if cutlass.const_expr(self.ctas > 1):
            rank, row, _ = cute.arch.block_idx()
        else:
            row, _, _ = cute.arch.block_idx()
        o = Outputs(out, raw, table, page, values, want)  # a fused build's; others write ``out`` alone
        marks = cute.make_rmem_tensor(len(PHASES) + 1, Int64)
        began = Int64(0)
        if cutlass.const_expr(self.profile):
            began = cute.arch.globaltimer()  # ns, the same clock on every SM
        begin_marks(marks, PHASES, self.profile)
        if cutlass.const_expr(self.pdl):  # the keys and lengths may come from the kernel before
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        # Warp w holds key columns [w * 32 * run, (w + 1) * 32 * run), its lanes side by side: key
        # i of lane l is column w * 32 * run + 32 * i + l, so each load is one coalesced line (a run
        # a thread cost 8 lines a warp load at 8K columns: ~2 us of L1 wavefronts a row).
        lane, warp = tid % 32, tid // 32
        span = min(cols, src.shape[1])  # key columns: block keys hold one a block of columns
        if cutlass.const_expr(self.pinned):
            span = min((cols + block - 1) // block, src.shape[1])
        run = (span + self.threads * self.ctas - 1) // (self.threads * self.ctas)  # <= per
        lo = warp * 32 * run + lane
        if cutlass.const_expr(self.ctas > 1):  # the cluster's warps in rank order
            lo = (rank * self.warps + warp) * 32 * run + lane
        keys = cute.make_rmem_tensor(self.per, Uint32)
        for i in cutlass.range_constexpr(self.per):
            keys[i] = Uint32(0)
        if cutlass.const_expr(not self.pinned):  # read before the row's length is known: the loads overlap
            if span > 0:
                for i in cutlass.range_constexpr(self.per):  # every load in flight before the first use
                    x = src[row, min(lo + 32 * i, span - 1)]
                    keys[i] = cutlass.select_(run > i, source_key(x, self.source, self.ord16), Uint32(0))
        end = max(min(lengths[row], cols), Int32(0))
        first = cutlass.select_(windowed != 0, min(max(starts[row], Int32(0)), end), Int32(0))
        n = end - first  # keys ranked: ids count from the window's start
        newest = Int32(-1)  # block keys: the newest block, pinned after the ranked ones (-1: none)
        if cutlass.const_expr(self.pinned):
            newest = (n + block - 1) // block - 1
            n = max(newest, Int32(0))
        smem = cutlass.memory.SmemAllocator()
        hist = smem.allocate_tensor(Int32, cute.make_layout(HIST), 16)
        parts = smem.allocate_tensor(Int32, cute.make_layout(self.parts * BINS), 16)
        info = smem.allocate_tensor(Int32, cute.make_layout(4), 16)
        warp_sums = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        tail = smem.allocate_tensor(Uint32, cute.make_layout(TAIL + 1), 16)
        bounds = smem.allocate_tensor(Uint32, cute.make_layout(2 * self.warps), 16)  # each warp's largest, smallest key
        # A fused build's kept ids in slot order: written out through Outputs once placed, so the
        # outputs' registers are not live beside the keys'.
        staged = smem.allocate_tensor(Int32, cute.make_layout(TOPK_MAX_K + 1 if self.fused else 1), 16)
        if (n <= k) | (k <= 0):  # every valid id (block keys: then the newest), then -1; no key read
            kept = max(min(n, k), Int32(0))
            gid = tid  # this thread's place among the row's (a cluster's CTAs in rank order)
            if cutlass.const_expr(self.ctas > 1):
                gid = rank * self.threads + tid
            for j in range(gid, o.out.shape[1], self.threads * self.ctas):
                emit(o, src, row, first, j, cutlass.select_(j < kept, j, cutlass.select_(j == kept, newest, Int32(-1))),
                     self.fused, self.pinned)
        else:
            if cutlass.const_expr(self.pinned):  # only the valid blocks' keys were written: read no further
                for i in cutlass.range_constexpr(self.per):
                    x = src[row, min(lo + 32 * i, n - 1)]
                    keys[i] = cutlass.select_((run > i) & (lo + 32 * i < n), source_key(x, self.source, False),
                                              Uint32(0))
            elif cutlass.const_expr(self.trim):
                if (first != 0) | (end != run * self.threads * self.ctas):  # CTA-uniform: else every key read is valid
                    self.mask(keys, run, lo, first, end)
            else:
                self.mask(keys, run, lo, first, end)
            zero_fill(hist, 3 * BINS if self.trim else HIST, tid, self.threads)  # lean rounds: three histograms
            if tid == 0:
                tail[GATHERED] = Uint32(0)
                if cutlass.const_expr(self.pinned):  # after the k ranked blocks (now: nothing live across the select)
                    if rank == 0:  # a cluster's first CTA
                        emit(o, src, row, first, k, newest, self.fused, self.pinned)
            cute.arch.sync_threads()
            self.mark(marks, "keys in")

            if cutlass.const_expr(self.trim):
                if run == self.per:  # CTA-uniform: every thread holds per keys, so no key waits on a test of run
                    self.select(keys, self.per, k, hist, parts, info, tail, bounds, lo, first, row, o.out, staged,
                                warp_sums, tid, marks)
                else:
                    self.select(keys, run, k, hist, parts, info, tail, bounds, lo, first, row, o.out, staged,
                                warp_sums, tid, marks)
            else:
                self.select(keys, run, k, hist, parts, info, tail, bounds, lo, first, row, o.out, staged, warp_sums,
                            tid, marks)
            self.write_marks(o.out, marks, began, row, k, tid + rank * self.threads)
            if cutlass.const_expr(self.ctas > 1):  # the others may read this CTA's shared memory until they arrive
                cute.arch.cluster_wait()
            if cutlass.const_expr(self.fused):
                cute.arch.sync_threads()
                for j in range(tid, k, self.threads):  # n > k: k kept (clamped: memory-safe were one not staged)
                    emit(o, src, row, first, j, min(max(staged[j], Int32(0)), n - 1), self.fused, self.pinned)

    @cute.jit
    def select(self, keys: cute.Tensor, run, k: Int32, hist: cute.Tensor, parts: cute.Tensor, info: cute.Tensor,
               tail: cute.Tensor, bounds: cute.Tensor, lo: Int32, first: Int32, row: Int32, out: cute.Tensor,
               staged: cute.Tensor, warp_sums: cute.Tensor, tid: Int32, marks: cute.Tensor):
        """t, then the kept ids (``run``: the keys a thread holds, an Int32, or a Python int where the
        build knows it, so the passes test no key against it)."""
        t, take, ties = self.threshold(keys, run, k, hist, parts, info, tail, bounds, tid, marks)
        self.write_kept(keys, run, t, take, ties, lo - (Int32(0) if self.pinned else first), row, out, staged,
                        warp_sums, tid, marks)

    @cute.jit
    def mask(self, keys: cute.Tensor, run: Int32, lo: Int32, first: Int32, end: Int32):
        """Keys outside the window [first, end) are no keys (0)."""
        for i in cutlass.range_constexpr(self.per):
            inside = (lo + 32 * i >= first) & (lo + 32 * i < end)
            keys[i] = cutlass.select_(inside, keys[i], Uint32(0))

    @cute.jit
    def write_marks(self, out: cute.Tensor, marks: cute.Tensor, began: Int64, row: Int32, k: Int32, tid: Int32):
        """A profiled build: thread 0's clock at each phase's end, in cycles since the kernel began,
        then the CTA's start and end on the global timer (ns, low 32 bits), at out[row, k + 1 ...]
        (a pinned row's newest block is at k)."""
        if cutlass.const_expr(self.profile):
            ended = cute.arch.globaltimer()
            if tid == 0:
                for phase in cutlass.range_constexpr(len(PHASES)):
                    out[row, k + 1 + phase] = Int32(marks[phase + 1] - marks[0])
                out[row, k + 1 + len(PHASES)] = Int32(began & Int64(0xFFFFFFFF))
                out[row, k + 1 + len(PHASES) + 1] = Int32(ended & Int64(0xFFFFFFFF))


# A catalog entry, and ``compiled``'s configuration: (source, pdl, threads, ord16, fused, lean, trim[, ctas]).
def catalog(target) -> list[tuple]:
    """Every build ``launch.select`` takes, while the path is on (``SHORT_ROWS``), as
    programmatic dependents where ``pdl.enabled`` says so for the op each serves, lean where
    ``LEAN`` says so: scores of each dtype with and without the fused outputs, block keys likewise,
    and the DCP pack's ord16 keys; each at both widths."""
    if not SHORT_ROWS:
        return []
    sources = [(s, False, f) for s in (*TOPK_SCORES, BLOCK_KEYS) for f in (False, True)]
    sources += [(s, True, False) for s in DCP_SCORES]
    built = [(s, pdl.enabled(pdl.for_keys(ord16)), threads, ord16, f, lean_for(threads), trim_for(threads))
             for s, ord16, f in sources for threads in (THREADS, HALF)]
    if clusters_for(False):
        built += [cluster_config(s, pdl.enabled(pdl.for_keys(ord16)), threads // c, ord16, c)
                  for s, ord16, f in sources if not f for threads in (THREADS, HALF) for c in CLUSTER_SIZES]
    if widest(False) > SHORT_MAX:
        built += [cluster_config(s, pdl.enabled(pdl.for_keys(ord16)), t, ord16, c)
                  for s, ord16, f in sources if not f for c, t in wide_builds()]
    return built


@cached_kernel("topk_short_row", catalog)
def compiled(source: torch.dtype, pdl: bool = False, threads: int = THREADS, ord16: bool = False,
             fused: bool = False, lean: bool = False, trim: bool = False, ctas: int = 1, profile: bool = False):
    """The short-row select for one source (a score dtype, or int32 block keys) in CTAs of
    ``threads``, lean or not (``LEAN``), trimmed or not (``TRIM``), a row over a cluster of ``ctas``
    (``CLUSTER``), from fake tensors (no GPU needed); ``profile``: with phase marks (``ShortRowTopk``;
    benchmarks/profile_short_row.py --phases)."""
    return build(ShortRowTopk(source, pdl, threads, ord16, fused, profile=profile, one_barrier=lean, ties_taken=lean,
                              trim=trim, ctas=ctas), source)


def build(topk: ShortRowTopk, source: torch.dtype):
    """``topk`` (a ShortRowTopk, or a variant of it) compiled from fake tensors; called as
    ``(src, lengths, starts, windowed, cols, block, k, out, raw, table, page, values, want)``."""
    rows, width = cute.sym_int(), cute.sym_int()
    dtype = cute_type(source)
    src = fake_tensor(dtype, (rows, width), (cute.sym_int64(), 1))
    lengths = fake_tensor(Int32, (rows,), (1,))
    starts = fake_tensor(Int32, (rows,), (1,))
    out, raw, table = (fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1)) for _ in range(3))
    values = fake_tensor(dtype, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1))
    return cute.compile(topk, src, lengths, starts, Int32(0), Int32(0), Int32(1), Int32(1), out, raw, table,
                        Int32(0), values, Int32(0), fake_stream(), options="--enable-tvm-ffi")
