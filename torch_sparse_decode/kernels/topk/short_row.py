"""The short-row select (CuTe DSL): the top-k of a row whose window holds at most SHORT_MAX keys,
in one CTA, with no cluster, ring or copy.

- One CTA of THREADS threads per row (HALF where the batch has more rows than SMs and its
  columns fit: ``threads_for``). The batch's columns are split into one contiguous run a warp
  of 32 * ceil(columns / threads) <= 32 * PER, its lanes side by side (coalesced
  loads), read once into registers while the row's length is read (then masked to the window):
  id order is warp, then key, then lane.
- The k-th largest key t is found one 8-bit digit at a time, top first (four digits for fp32
  keys; bf16 and fp16 keys widen to fp32 with their low 16 / 8 bits fixed by the sign, so two
  and three digits, and the rest follows from t's sign). Each digit is read off a 256-bin
  histogram of the keys that match the digits found so far. The histogram is kept once per
  lane (a warp's lanes never add to one address), so rows of one or few values cost no more
  than random ones; the CTA sums the copies and one warp scans the bins from the top.
- Settling early: once two digits are found (fp32 and fp16 keys; and three, fp32), the bin that
  holds t is settled without the remaining rounds where it can be: a bin of at most TAIL keys
  (randn rows of 8K-16K: ~10-70) is gathered into shared memory and one warp ranks it; a longer
  one whose keys are all equal (all-equal, few-valued and ReLU'd rows) is t. Others take the rounds.
- Output: each warp counts its keys > t and == t by ballots; one barrier gives each warp the
  counts of the warps below, and each key's ballots its place among its warp's: a key > t at
  (keys > t before it) + min(ties before it, ties taken), a tie iff fewer than ``take`` ties
  precede it. Ids come out ascending, ties to the lowest ids, with no
  sort; nothing is written outside ``out``.
- A row of at most k keys keeps them all (every valid id, then -1), as the engine does.

The ops take it where ``launch.select`` finds the batch's columns <= SHORT_MAX (a shape test:
graph-safe, and both paths are exact, so a row's ids never depend on the other rows), behind
``SHORT_ROWS``: exact on the H200, but not yet faster than the engine (docs/topk_engine.md).
"""

from __future__ import annotations

import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ...dtypes import TOPK_SCORES, cute_type
from .. import pdl
from ..compile import cached_kernel, fake_stream, fake_tensor
from ..cute import popc, scan_from_top, zero_fill
from .cluster import ballot_of
from .keys import source_key

# Opt-in until the path is faster than the engine: TORCH_SPARSE_DECODE_SHORT_ROWS=1.
SHORT_ROWS = os.environ.get("TORCH_SPARSE_DECODE_SHORT_ROWS", "0") == "1"

THREADS = 1024
PER = 16  # keys per thread at most
SHORT_MAX = THREADS * PER  # the widest window the path takes
# A batch of more rows than SMs whose columns fit HALF threads takes CTAs of HALF threads: two
# fit an SM (64 registers a thread), so one CTA's barriers and one-warp scans hide under the other's work.
HALF = THREADS // 2
RADIX = 8
BINS = 1 << RADIX
COPY = BINS + 1  # words per lane's histogram copy: the copies' same bins fall in distinct banks
# Digits each source's keys need: the low 32 - 8 * digits bits of a widened bf16 / fp16 key are
# all 0 (non-negative scores) or all 1 (negative ones: ordered_key flips them).
DIGIT_ROUNDS = {torch.float32: 4, torch.float16: 3, torch.bfloat16: 2}
# info words: scan_from_top's digit found and the keys in the bins above it (word 2 is its need); settle's verdict
DIGIT, ABOVE, _, SETTLED = range(4)
# From TAIL_DIGITS digits on, a bin that is short (at most TAIL keys; randn 8K: ~10, 16K: ~30) is
# ranked by one warp, and one whose keys are all equal (tie-heavy rows) gives t at once: either
# settles t without the remaining rounds (each ~three barriers and a one-warp scan).
TAIL_DIGITS = 2
TAIL = 128
GATHERED = TAIL  # the tail list's word that counts the keys gathered into it


def threads_for(rows: int, cols: int, sms: int) -> int:
    """A CTA's threads for a batch (a shape test: the same in every replay)."""
    return HALF if rows > sms and cols <= HALF * PER else THREADS


class ShortRowTopk:
    """The short-row select for one source dtype, in CTAs of ``threads`` (THREADS or HALF);
    ``pdl``: launched as a programmatic dependent of the kernel before (``kernels/pdl.py``)."""

    def __init__(self, source: torch.dtype, pdl: bool = False, threads: int = THREADS):
        self.source = cute_type(source)
        self.rounds = DIGIT_ROUNDS[source]
        self.tail_digits = TAIL_DIGITS
        self.pdl = pdl
        self.threads = threads
        self.warps = threads // 32
        self.parts = threads // BINS  # the copies are summed in parts groups of 32 // parts

    @cute.jit
    def __call__(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
                 k: Int32, out: cute.Tensor, stream):
        self.kernel(src, lengths, starts, windowed, cols, k, out).launch(
            grid=[out.shape[0], 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
               k: Int32, out: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.pdl):  # the scores and lengths may come from the kernel before
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        # The row's keys are read before its length is known (the two loads overlap). Warp w holds
        # columns [w * 32 * run, (w + 1) * 32 * run) of the batch's width, its lanes side by side:
        # key i of lane l is column w * 32 * run + 32 * i + l, so each load is one coalesced line
        # (a run a thread cost 8 lines a warp load at 8K columns: ~2 us of L1 wavefronts a row).
        lane, warp = tid % 32, tid // 32
        run = (cols + self.threads - 1) // self.threads  # <= PER
        lo = warp * 32 * run + lane
        keys = cute.make_rmem_tensor(PER, Uint32)
        for i in cutlass.range_constexpr(PER):
            keys[i] = Uint32(0)
        if cols > 0:
            for i in cutlass.range_constexpr(PER):  # every load in flight before the first use
                x = src[row, min(lo + 32 * i, cols - 1)]
                keys[i] = cutlass.select_(run > i, source_key(x, self.source, False), Uint32(0))
        end = max(min(lengths[row], cols), Int32(0))
        first = cutlass.select_(windowed != 0, min(max(starts[row], Int32(0)), end), Int32(0))
        n = end - first
        smem = cutlass.memory.SmemAllocator()
        hist = smem.allocate_tensor(Int32, cute.make_layout(32 * COPY), 16)
        parts = smem.allocate_tensor(Int32, cute.make_layout(self.parts * BINS), 16)
        info = smem.allocate_tensor(Int32, cute.make_layout(4), 16)
        warp_sums = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        tail = smem.allocate_tensor(Uint32, cute.make_layout(TAIL + 1), 16)
        bounds = smem.allocate_tensor(Uint32, cute.make_layout(2 * self.warps), 16)  # each warp's largest, smallest key
        if n <= k:  # every valid id, then -1
            for j in range(tid, out.shape[1], self.threads):
                out[row, j] = cutlass.select_(j < n, j, Int32(-1))
        else:
            zero_fill(hist, 32 * COPY, tid, self.threads)
            if tid == 0:
                tail[GATHERED] = Uint32(0)
            for i in cutlass.range_constexpr(PER):
                inside = (lo + 32 * i >= first) & (lo + 32 * i < end)
                keys[i] = cutlass.select_(inside, keys[i], Uint32(0))
            cute.arch.sync_threads()

            t, take = self.threshold(keys, run, k, hist, parts, info, tail, bounds, tid)
            self.write_kept(keys, run, t, take, lo - first, row, out, warp_sums, tid)

    @cute.jit
    def threshold(self, keys: cute.Tensor, run: Int32, k: Int32, hist: cute.Tensor, parts: cute.Tensor,
                  info: cute.Tensor, tail: cute.Tensor, bounds: cute.Tensor, tid: Int32):
        """(t, take): the k-th largest key and how many keys equal to it the best k hold."""
        need = k
        t = Uint32(0)
        settled = Int32(0)  # t is known: the remaining rounds are skipped (CTA-uniform)
        for p in cutlass.range_constexpr(self.rounds):
            if cutlass.const_expr(p < self.tail_digits):
                t, need = self.digit_round(keys, run, t, need, k, p, hist, parts, info, tid)
            else:
                if settled == 0:
                    t, need = self.digit_round(keys, run, t, need, k, p, hist, parts, info, tid)
            if cutlass.const_expr(self.tail_digits <= p + 1 < self.rounds):
                if settled == 0:
                    found, need, settled = self.settle(keys, run, t, need, p, parts, info, tail, bounds, tid)
                    t = Uint32(found)
        low = 32 - RADIX * self.rounds
        if cutlass.const_expr(low > 0):  # the bits below the digits follow from the sign
            fill = Uint32((1 << low) - 1)
            t = t | cutlass.select_(t >= Uint32(0x80000000), Uint32(0), fill)
        return t, need

    @cute.jit
    def digit_round(self, keys: cute.Tensor, run: Int32, t: Uint32, need: Int32, k: Int32,
                    p: cutlass.Constexpr[int], hist: cute.Tensor, parts: cute.Tensor, info: cute.Tensor, tid: Int32):
        """(t, need) with digit p found: its bin's keys hold the need-th largest."""
        shift = 32 - RADIX * (p + 1)
        self.count(keys, run, t, p, shift, hist, tid)
        cute.arch.sync_threads()
        self.sum_copies(hist, parts, tid)
        cute.arch.sync_threads()
        if tid < 32:  # one warp: bin b's count summed over the copies' groups
            scan_from_top(lambda b: self.bin_count(parts, b), need, k, info, tid)
        cute.arch.sync_threads()
        return t | (Uint32(info[DIGIT]) << Uint32(shift)), need - info[ABOVE]

    @cute.jit
    def settle(self, keys: cute.Tensor, run: Int32, t: Uint32, need: Int32, p: cutlass.Constexpr[int],
               parts: cute.Tensor, info: cute.Tensor, tail: cute.Tensor, bounds: cute.Tensor, tid: Int32):
        """(t, need, settled) after digit p, from the bin of keys whose digits are t's so far: a
        short bin is gathered into ``tail`` and one warp ranks it; a long one's bounds are found,
        and if they meet, t is its one key."""
        shift = 32 - RADIX * (p + 1)
        m = self.bin_count(parts, info[DIGIT])  # the bin's keys (the scan's sums are still there)
        lane, warp = tid % 32, tid // 32
        if m <= TAIL:
            for i in cutlass.range_constexpr(PER):
                if run > i:
                    key = keys[i]
                    if (key != Uint32(0)) & ((key >> Uint32(shift)) == (t >> Uint32(shift))):
                        tail[Int32(cute.arch.atomic_add(tail.iterator + GATHERED, Uint32(1)))] = key
        else:
            high = Uint32(0)
            low = Uint32(0xFFFFFFFF)
            for i in cutlass.range_constexpr(PER):
                if run > i:
                    key = keys[i]
                    if (key != Uint32(0)) & ((key >> Uint32(shift)) == (t >> Uint32(shift))):
                        high = max(high, key)
                        low = min(low, key)
            high = cute.arch.warp_redux_sync(high, "umax")
            low = cute.arch.warp_redux_sync(low, "umin")
            if lane == 0:
                bounds[warp] = high
                bounds[self.warps + warp] = low
        cute.arch.sync_threads()
        if tid < 32:
            found = t
            take = need
            if m <= TAIL:
                found, take = self.rank(tail, need, lane)
                found = Uint32(found)
            else:
                mine = lane % self.warps
                found = Uint32(cute.arch.warp_redux_sync(bounds[mine], "umax"))
                low = cute.arch.warp_redux_sync(bounds[self.warps + mine], "umin")
                take = cutlass.select_(low == found, need, Int32(-1))
            if lane == 0:
                info[DIGIT] = Int32(found)
                info[ABOVE] = take
                info[SETTLED] = cutlass.select_(take >= 0, Int32(1), Int32(0))
        cute.arch.sync_threads()
        settled = info[SETTLED]
        t = cutlass.select_(settled != 0, Uint32(info[DIGIT]), t)
        return t, cutlass.select_(settled != 0, info[ABOVE], need), settled

    @cute.jit
    def rank(self, tail: cute.Tensor, need: Int32, lane: Int32):
        """(t, take) among the m <= TAIL keys gathered into ``tail`` (one warp): t is the largest key
        x with at least need of them >= x, and take is need less the keys > t."""
        m = Int32(tail[GATHERED])
        held = cute.make_rmem_tensor(TAIL // 32, Uint32)  # lane l: keys l, l + 32, ...; 0 past m
        at_least = cute.make_rmem_tensor(TAIL // 32, Int32)
        for h in cutlass.range_constexpr(TAIL // 32):
            held[h] = Uint32(0)
            at_least[h] = Int32(0)
            if lane + 32 * h < m:
                held[h] = tail[lane + 32 * h]
        for j in range(m):
            v = tail[j]
            for h in cutlass.range_constexpr(TAIL // 32):
                at_least[h] = at_least[h] + cutlass.select_(v >= held[h], Int32(1), Int32(0))
        best = Uint32(0)  # a held 0 has all m >= it, and loses to every key
        for h in cutlass.range_constexpr(TAIL // 32):
            best = cutlass.select_((at_least[h] >= need) & (held[h] > best), held[h], best)
        best = cute.arch.warp_redux_sync(best, "umax")
        above = Int32(0)
        for h in cutlass.range_constexpr(TAIL // 32):
            above = above + cutlass.select_(held[h] > best, Int32(1), Int32(0))
        return best, need - cute.arch.warp_redux_sync(above, "add")

    @cute.jit
    def count(self, keys: cute.Tensor, run: Int32, t: Uint32, p: cutlass.Constexpr[int],
              shift: cutlass.Constexpr[int], hist: cute.Tensor, tid: Int32):
        """Add this thread's keys whose digits above digit p are t's to its lane's histogram copy,
        one atomic a key. (Adding a run of equal digits at once cost more in branches than it saved
        in atomics, and one histogram per warp with match.any more still: H200, 1 x 8K, 14.7 and
        16.5 us against 12.1.) Keys past the run are skipped by a branch the whole CTA takes alike."""
        copy = (tid % 32) * COPY
        for i in cutlass.range_constexpr(PER):
            if run > i:
                key = keys[i]
                live = key != Uint32(0)
                if cutlass.const_expr(p > 0):
                    live = live & ((key >> Uint32(shift + RADIX)) == (t >> Uint32(shift + RADIX)))
                if live:
                    cute.arch.atomic_add(hist.iterator + (copy + Int32((key >> Uint32(shift)) & Uint32(BINS - 1))),
                                         Int32(1))

    @cute.jit
    def sum_copies(self, hist: cute.Tensor, parts: cute.Tensor, tid: Int32):
        """parts[q * BINS + b]: bin b summed over the q-th group of lane copies, which this thread
        then clears for the next digit (it is their only reader)."""
        b = tid % BINS
        q = tid // BINS
        per = 32 // self.parts
        total = Int32(0)
        for c in cutlass.range_constexpr(per):
            at = (q * per + c) * COPY + b
            total = total + hist[at]
            hist[at] = Int32(0)
        parts[q * BINS + b] = total

    @cute.jit
    def bin_count(self, parts: cute.Tensor, b: Int32) -> Int32:
        total = Int32(0)
        for q in cutlass.range_constexpr(self.parts):
            total = total + parts[q * BINS + b]
        return total

    @cute.jit
    def write_kept(self, keys: cute.Tensor, run: Int32, t: Uint32, take: Int32, lo: Int32, row: Int32,
                   out: cute.Tensor, warp_sums: cute.Tensor, tid: Int32):
        """The kept ids at their places: keys > t and the first ``take`` keys == t, in id order.
        Id order is warp, then key, then lane: a warp's ballots of each key place its lanes, and
        one barrier gives each warp the counts of the warps below it."""
        lane, warp = tid % 32, tid // 32
        below = Uint32(cute.arch.lanemask_lt())
        counts = Int32(0)  # keys > t (low 16 bits) and == t (high): the CTA's sums are < 2**16
        for i in cutlass.range_constexpr(PER):
            if run > i:
                counts = counts + popc(ballot_of(keys[i] > t)) + (popc(ballot_of(keys[i] == t)) << 16)
        if lane == 0:
            warp_sums[warp] = counts
        cute.arch.sync_threads()
        before = cute.arch.warp_redux_sync(cutlass.select_(lane < warp, warp_sums[lane % self.warps], Int32(0)), "add")
        kept_before = before & Int32(0xFFFF)
        tied_before = before >> 16
        width = out.shape[1]
        for i in cutlass.range_constexpr(PER):
            if run > i:
                above = keys[i] > t
                at_t = keys[i] == t
                above_votes = ballot_of(above)
                tie_votes = ballot_of(at_t)
                mine_kept = kept_before + popc(above_votes & below)
                mine_tied = tied_before + popc(tie_votes & below)
                slot = mine_kept + min(mine_tied, take)
                if (above | (at_t & (mine_tied < take))) & (slot < width):  # exact counts never fail the last
                    out[row, slot] = lo + 32 * i
                kept_before = kept_before + popc(above_votes)
                tied_before = tied_before + popc(tie_votes)


def catalog(target) -> list[tuple]:
    """Two builds (THREADS, HALF) per score dtype, while the path is opted into (``SHORT_ROWS``), as
    programmatic dependents where ``pdl.enabled()`` says so."""
    if not SHORT_ROWS:
        return []
    return [(source, pdl.enabled(), threads) for source in TOPK_SCORES for threads in (THREADS, HALF)]


@cached_kernel("topk_short_row", catalog)
def compiled(source: torch.dtype, pdl: bool = False, threads: int = THREADS):
    """The short-row select for one score dtype in CTAs of ``threads``, from fake tensors (no GPU needed)."""
    rows, width = cute.sym_int(), cute.sym_int()
    src = fake_tensor(cute_type(source), (rows, width), (cute.sym_int64(), 1))
    lengths = fake_tensor(Int32, (rows,), (1,))
    starts = fake_tensor(Int32, (rows,), (1,))
    out = fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1))
    return cute.compile(ShortRowTopk(source, pdl, threads), src, lengths, starts, Int32(0), Int32(0), Int32(1), out,
                        fake_stream(), options="--enable-tvm-ffi")
