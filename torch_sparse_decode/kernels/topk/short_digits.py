"""The short-row select's search for t, the k-th largest key of a row held in registers (a mixin
of ``ShortRowTopk``: ``rounds``, ``tail_digits``, ``fill``, ``threads``, ``warps``, ``parts``,
``per``, ``profile``, ``one_barrier``, ``trim``, ``ctas``).

- One 8-bit digit at a time, top first. Each digit is read off a 256-bin histogram of the keys
  that match the digits found so far, kept once per lane, bin-major (lane l's count of bin b is
  word 32 * b + l: a lane always adds in its own bank, so a warp's atomics never conflict,
  whatever its keys' bins), so rows of one or few values cost no more than random ones; the CTA
  sums the copies and one warp scans the bins from the top: three barriers a digit.
- Settling early: from TAIL_DIGITS digits on, the bin that holds t is settled without the
  remaining rounds where it can be: a bin of at most TAIL keys (randn rows of 8K-16K: ~10-70) is
  gathered into shared memory and one warp ranks it; a longer one whose keys are all equal
  (all-equal, few-valued and ReLU'd rows) is t. Others take the rounds.
- ``one_barrier`` (the lean builds, ``short_row.LEAN``): rounds of one barrier. One 256-bin histogram for
  the CTA (a warp's atomics to one bin merge in one shared atomic; random bins meet in banks),
  three in turn, so the one a round counts into was cleared two rounds before, behind a barrier;
  after the round's barrier every warp reads it and finds the digit itself, the same in every
  warp: no sums of copies, no one-warp scan, no barrier after it. A bin of at most 32 keys is
  then ranked by every warp after the gather's barrier.
- ``trim`` (the trimmed lean builds, ``short_row.TRIM``): the search also gives the keys equal to t
  (the rank counts them; past the last round, t's bin is its one value), so the write knows
  before it counts whether every tie is kept; the rank of a bin of at most 32 keys holds one key
  a lane, not four.
- ``ctas`` > 1 (trimmed builds): the row's keys are spread over a cluster of CTAs. Each counts
  into its own histograms; after a cluster barrier each sums the round's histogram over the
  cluster (distributed shared memory) and finds the digit from the sums. A settling bin is
  gathered by each CTA into its own list and ranked from their union, or bounded over every
  CTA's warps: every CTA reaches the same t.
"""

from __future__ import annotations

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ..cute import popc, scan_from_top, stamp, warp_inclusive, zero_fill
from .cluster import cluster_sum, cluster_sync, load_rank

PER = 16  # keys a thread holds at most
# Digits each source's keys need: the low 32 - 8 * digits bits of a widened bf16 / fp16 key are
# all 0 (non-negative scores) or all 1 (negative ones: ordered_key flips them); block keys use all 32.
DIGIT_ROUNDS = {torch.float32: 4, torch.float16: 3, torch.bfloat16: 2, torch.int32: 4}
RADIX = 8
BINS = 1 << RADIX
HIST = 32 * BINS  # the lanes' histogram copies, bin-major: lane l's count of bin b is word 32 * b + l
SUMMED = 3 * BINS  # a cluster's lean rounds: the round's histogram summed over its CTAs (after the three)
# info words: scan_from_top's digit found and the keys in the bins above it (word 2 is its need); settle's verdict
# (a trimmed build's word 2: the keys equal to t)
DIGIT, ABOVE, TIES, SETTLED = range(4)
# From TAIL_DIGITS digits on, a bin that is short (at most TAIL keys; randn 8K: ~10, 16K: ~30) is
# ranked by one warp, and one whose keys are all equal (tie-heavy rows) gives t at once: either
# settles t without the remaining rounds (each ~three barriers and a one-warp scan).
TAIL_DIGITS = 2
TAIL = 128
GATHERED = TAIL  # the tail list's word that counts the keys gathered into it
# Where a profiled build (ShortRowTopk(profile=True), benchmarks/profile_short_row.py) stamps
# thread 0's clock: the end of each phase (a phase the row skips ends where the one before it did).
PHASES = ("keys in", "digit 0", "digit 1", "tail", "digit 2", "digit 3", "counts", "written")


class ShortDigits:
    """Finding t (see the module docstring)."""

    @cute.jit
    def mark(self, marks: cute.Tensor, phase: cutlass.Constexpr[str]):
        """A profiled build (``profile``): the SM clock at the end of the phase named (PHASES)."""
        stamp(marks, PHASES, phase, self.profile)

    @cute.jit
    def threshold(self, keys: cute.Tensor, run: Int32, k: Int32, hist: cute.Tensor, parts: cute.Tensor,
                  info: cute.Tensor, tail: cute.Tensor, bounds: cute.Tensor, tid: Int32, marks: cute.Tensor):
        """(t, take, ties): the k-th largest key, how many keys equal to it the best k hold, and (a
        trimmed build; else -1) how many the row holds."""
        need = k
        t = Uint32(0)
        m = Int32(0)  # one_barrier: the keys in the bin of t's digits so far, known to every warp
        settled = Int32(0)  # t is known: the remaining rounds are skipped (CTA-uniform)
        ties = Int32(-1)
        for p in cutlass.range_constexpr(self.rounds):
            if cutlass.const_expr(p < self.tail_digits):
                t, need, m = self.next_digit(keys, run, t, need, m, k, p, hist, parts, info, tid)
                self.mark(marks, f"digit {p}")
            else:
                if settled == 0:
                    t, need, m = self.next_digit(keys, run, t, need, m, k, p, hist, parts, info, tid)
                    self.mark(marks, f"digit {p}")
            if cutlass.const_expr(self.tail_digits <= p + 1 < self.rounds):
                if settled == 0:
                    found, need, settled, ties = self.settle(keys, run, t, need, m, p, parts, info, tail, bounds, tid)
                    t = Uint32(found)
                    self.mark(marks, "tail")
        low = 32 - RADIX * self.rounds
        if cutlass.const_expr(low > 0 and self.fill):  # a widened bf16 / fp16 key's low bits follow from its sign
            fill = Uint32((1 << low) - 1)
            t = t | cutlass.select_(t >= Uint32(0x80000000), Uint32(0), fill)
        if cutlass.const_expr(self.trim):  # past the last round, t's bin holds its one value
            ties = cutlass.select_(settled != 0, ties, m)
        return t, need, ties

    @cute.jit
    def next_digit(self, keys: cute.Tensor, run: Int32, t: Uint32, need: Int32, m: Int32, k: Int32,
                   p: cutlass.Constexpr[int], hist: cute.Tensor, parts: cute.Tensor, info: cute.Tensor, tid: Int32):
        """(t, need, m) with digit p found (m: one_barrier's bin count, else left as it was)."""
        if cutlass.const_expr(self.one_barrier):
            t, need, m = self.one_barrier_round(keys, run, t, need, p, hist, tid)
        else:
            t, need = self.digit_round(keys, run, t, need, k, p, hist, parts, info, tid)
        return t, need, m

    @cute.jit
    def one_barrier_round(self, keys: cute.Tensor, run: Int32, t: Uint32, need: Int32, p: cutlass.Constexpr[int],
                          hist: cute.Tensor, tid: Int32):
        """(t, need, the keys in the digit's bin) with digit p found, in every warp: one barrier."""
        shift = 32 - RADIX * (p + 1)
        base = (p % 3) * BINS  # histogram p % 3 of three
        self.count(keys, run, t, p, shift, hist, tid, base)
        read = base
        if cutlass.const_expr(self.ctas > 1):  # the round's histogram summed over the cluster's CTAs
            cluster_sync(self.ctas)
            for j in cutlass.range_constexpr(-(-BINS // self.threads)):
                if tid + j * self.threads < BINS:
                    hist[SUMMED + tid + j * self.threads] = cluster_sum(hist, base + tid + j * self.threads, self.ctas)
            read = SUMMED
        cute.arch.sync_threads()
        lane = tid % 32
        counts = cute.make_rmem_tensor(8, Int32)  # lane l: bins 255 - 8 l .. 248 - 8 l, from the top
        mine = Int32(0)
        for b in cutlass.range_constexpr(8):
            counts[b] = hist[read + 255 - 8 * lane - b]
            mine = mine + counts[b]
        inclusive = warp_inclusive(mine, lane)
        reached = Uint32(cute.arch.vote_ballot_sync(inclusive >= need))
        first = popc((reached & (Uint32(0) - reached)) - Uint32(1))  # the first lane whose bins reach need
        above = inclusive - mine
        digit = Int32(0)
        in_bin = Int32(0)
        found = Int32(0)
        for b in cutlass.range_constexpr(8):
            hit = (found == 0) & (above + counts[b] >= need)
            digit = cutlass.select_(hit, Int32(255 - b) - 8 * lane, digit)
            in_bin = cutlass.select_(hit, counts[b], in_bin)
            found = cutlass.select_(hit, Int32(1), found)
            above = cutlass.select_(found == 0, above + counts[b], above)
        digit = cute.arch.shuffle_sync(digit, first)
        above = cute.arch.shuffle_sync(above, first)
        in_bin = cute.arch.shuffle_sync(in_bin, first)
        later = ((p + 2) % 3) * BINS  # read last in the round before this one's barrier
        if cutlass.const_expr(self.threads >= BINS):
            if tid < BINS:
                hist[later + tid] = Int32(0)
        else:
            zero_fill(cute.make_tensor(hist.iterator + later, cute.make_layout(BINS)), BINS, tid, self.threads)
        return t | (Uint32(digit) << Uint32(shift)), need - above, in_bin

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
    def settle(self, keys: cute.Tensor, run: Int32, t: Uint32, need: Int32, m: Int32, p: cutlass.Constexpr[int],
               parts: cute.Tensor, info: cute.Tensor, tail: cute.Tensor, bounds: cute.Tensor, tid: Int32):
        """(t, need, settled, ties) after digit p, from the bin of keys whose digits are t's so far (m
        of them: one_barrier's count, else read here): a short bin is gathered into ``tail`` and
        ranked; a long one's bounds are found, and if they meet, t is its one key. ties: the keys
        equal to t where settled (a trimmed build; else -1)."""
        shift = 32 - RADIX * (p + 1)
        if cutlass.const_expr(not self.one_barrier):
            m = self.bin_count(parts, info[DIGIT])  # the bin's keys (the scan's sums are still there)
        lane, warp = tid % 32, tid // 32
        if m <= TAIL:
            for i in cutlass.range_constexpr(self.per):
                if run > i:
                    key = keys[i]
                    if (key != Uint32(0)) & ((key >> Uint32(shift)) == (t >> Uint32(shift))):
                        tail[Int32(cute.arch.atomic_add(tail.iterator + GATHERED, Uint32(1)))] = key
        else:
            high = Uint32(0)
            low = Uint32(0xFFFFFFFF)
            for i in cutlass.range_constexpr(self.per):
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
        if cutlass.const_expr(self.ctas > 1):  # every CTA's gathered keys or bounds, to every CTA
            cluster_sync(self.ctas)
        else:
            cute.arch.sync_threads()
        ties = Int32(-1)
        if cutlass.const_expr(self.one_barrier):
            found = t
            take = need
            settled = Int32(1)
            if m <= 32:  # CTA-uniform: every warp ranks the gathered keys, no second barrier
                if cutlass.const_expr(self.ctas > 1):
                    ranked, take, ties = self.rank_union(tail, need, lane, 1)
                else:
                    ranked, take, ties = self.rank(tail, need, lane, 1 if self.trim else TAIL // 32)
                found = Uint32(ranked)
            else:
                decided, take, settled, ties = self.decide(t, need, m, info, tail, bounds, lane, tid)
                found = Uint32(decided)
        else:
            found, take, settled, ties = self.decide(t, need, m, info, tail, bounds, lane, tid)
        return found, take, settled, ties

    @cute.jit
    def decide(self, t: Uint32, need: Int32, m: Int32, info: cute.Tensor, tail: cute.Tensor, bounds: cute.Tensor,
               lane: Int32, tid: Int32):
        """``settle``'s verdict (t, take, settled, ties) from one warp, shared through ``info`` behind a
        barrier."""
        if tid < 32:
            found = t
            take = need
            ties = m  # the bin's keys, where they are all equal
            if m <= TAIL:
                if cutlass.const_expr(self.ctas > 1):
                    found, take, ties = self.rank_union(tail, need, lane, TAIL // 32)
                else:
                    found, take, ties = self.rank(tail, need, lane)
                found = Uint32(found)
            else:
                if cutlass.const_expr(self.ctas > 1):
                    found, low = self.cluster_bounds(bounds, lane)
                else:
                    mine = lane % self.warps
                    found = Uint32(cute.arch.warp_redux_sync(bounds[mine], "umax"))
                    low = cute.arch.warp_redux_sync(bounds[self.warps + mine], "umin")
                take = cutlass.select_(low == found, need, Int32(-1))
            if lane == 0:
                info[DIGIT] = Int32(found)
                info[ABOVE] = take
                info[SETTLED] = cutlass.select_(take >= 0, Int32(1), Int32(0))
                if cutlass.const_expr(self.trim):
                    info[TIES] = ties
        cute.arch.sync_threads()
        settled = info[SETTLED]
        ties = Int32(-1)
        if cutlass.const_expr(self.trim):
            ties = info[TIES]
        t = cutlass.select_(settled != 0, Uint32(info[DIGIT]), t)
        return t, cutlass.select_(settled != 0, info[ABOVE], need), settled, ties

    @cute.jit
    def rank(self, tail: cute.Tensor, need: Int32, lane: Int32, slots: cutlass.Constexpr[int] = TAIL // 32):
        """(t, take, ties) among the m <= 32 * slots keys gathered into ``tail`` (one warp): t is the
        largest key x with at least need of them >= x, take is need less the keys > t, and ties
        (a trimmed build; else -1) the keys equal to t."""
        m = Int32(tail[GATHERED])
        held = cute.make_rmem_tensor(slots, Uint32)  # lane l: keys l, l + 32, ...; 0 past m
        at_least = cute.make_rmem_tensor(slots, Int32)
        for h in cutlass.range_constexpr(slots):
            held[h] = Uint32(0)
            at_least[h] = Int32(0)
            if lane + 32 * h < m:
                held[h] = tail[lane + 32 * h]
        for j in range(m):
            v = tail[j]
            for h in cutlass.range_constexpr(slots):
                at_least[h] = at_least[h] + cutlass.select_(v >= held[h], Int32(1), Int32(0))
        best = Uint32(0)  # a held 0 has all m >= it, and loses to every key
        for h in cutlass.range_constexpr(slots):
            best = cutlass.select_((at_least[h] >= need) & (held[h] > best), held[h], best)
        best = cute.arch.warp_redux_sync(best, "umax")
        above = Int32(0)
        for h in cutlass.range_constexpr(slots):
            above = above + cutlass.select_(held[h] > best, Int32(1), Int32(0))
        ties = Int32(-1)
        if cutlass.const_expr(self.trim):
            ties = Int32(0)
            for h in cutlass.range_constexpr(slots):
                ties = ties + cutlass.select_(held[h] == best, Int32(1), Int32(0))
            ties = cute.arch.warp_redux_sync(ties, "add")
        return best, need - cute.arch.warp_redux_sync(above, "add"), ties

    @cute.jit
    def rank_union(self, tail: cute.Tensor, need: Int32, lane: Int32, slots: cutlass.Constexpr[int]):
        """``rank`` over the keys every CTA of the cluster gathered (m <= 32 * slots of them): lane l
        holds keys l, l + 32, ... of their union, in rank order, and the warp ranks them by shuffles."""
        gathered = cute.make_rmem_tensor(self.ctas, Int32)
        m = Int32(0)
        for r in cutlass.range_constexpr(self.ctas):
            gathered[r] = load_rank(tail, Int32(GATHERED), Int32(r))
            m = m + gathered[r]
        held = cute.make_rmem_tensor(slots, Uint32)
        at_least = cute.make_rmem_tensor(slots, Int32)
        self.union_held(tail, gathered, held, at_least, lane, slots)
        return self.rank_held(held, at_least, need, m, slots)

    @cute.jit
    def union_held(self, tail: cute.Tensor, gathered: cute.Tensor, held: cute.Tensor, at_least: cute.Tensor,
                   lane: Int32, slots: cutlass.Constexpr[int]):
        """Lane l's ``held`` slots: keys l, l + 32, ... of the union of the lists the cluster's CTAs
        gathered (``gathered`` of each; 0 past them), its ``at_least`` counts cleared."""
        for h in cutlass.range_constexpr(slots):
            held[h] = Uint32(0)
            at_least[h] = Int32(0)
            offset = Int32(0)
            for r in cutlass.range_constexpr(self.ctas):
                q = lane + 32 * h - offset
                if (q >= 0) & (q < gathered[r]):
                    held[h] = Uint32(load_rank(tail, q, Int32(r)))
                offset = offset + gathered[r]

    @cute.jit
    def rank_held(self, held: cute.Tensor, at_least: cute.Tensor, need: Int32, m: Int32,
                  slots: cutlass.Constexpr[int]):
        """(t, take, ties) among the m keys the warp's lanes hold (``union_held``)."""
        self.count_at_least(held, at_least, m, slots)
        best = Uint32(0)
        for h in cutlass.range_constexpr(slots):
            best = cutlass.select_((at_least[h] >= need) & (held[h] > best), held[h], best)
        best = cute.arch.warp_redux_sync(best, "umax")
        above = Int32(0)
        ties = Int32(0)
        for h in cutlass.range_constexpr(slots):
            above = above + cutlass.select_(held[h] > best, Int32(1), Int32(0))
            ties = ties + cutlass.select_(held[h] == best, Int32(1), Int32(0))
        return best, need - cute.arch.warp_redux_sync(above, "add"), cute.arch.warp_redux_sync(ties, "add")

    @cute.jit
    def count_at_least(self, held: cute.Tensor, at_least: cute.Tensor, m: Int32, slots: cutlass.Constexpr[int]):
        """Each held key's ``at_least``: the m keys >= it, by one shuffle a key."""
        for g in cutlass.range_constexpr(slots):
            for j in range(min(m - 32 * g, Int32(32))):
                v = Uint32(cute.arch.shuffle_sync(Int32(held[g]), j))
                for h in cutlass.range_constexpr(slots):
                    at_least[h] = at_least[h] + cutlass.select_(v >= held[h], Int32(1), Int32(0))

    @cute.jit
    def cluster_bounds(self, bounds: cute.Tensor, lane: Int32):
        """(largest, smallest) of the bin's keys over every warp of the cluster's CTAs."""
        high = Uint32(0)
        low = Uint32(0xFFFFFFFF)
        for q in cutlass.range_constexpr(-(-self.ctas * self.warps // 32)):
            w = lane + 32 * q
            if w < self.ctas * self.warps:
                high = max(high, Uint32(load_rank(bounds, w % self.warps, w // self.warps)))
                low = min(low, Uint32(load_rank(bounds, self.warps + w % self.warps, w // self.warps)))
        return cute.arch.warp_redux_sync(high, "umax"), cute.arch.warp_redux_sync(low, "umin")

    @cute.jit
    def count(self, keys: cute.Tensor, run: Int32, t: Uint32, p: cutlass.Constexpr[int],
              shift: cutlass.Constexpr[int], hist: cute.Tensor, tid: Int32, base: cutlass.Constexpr[int] = 0):
        """Add this thread's keys whose digits above digit p are t's to its lane's histogram copy,
        one atomic a key, in the lane's own bank. (Adding a run of equal digits at once cost more in
        branches than it saved in atomics, and one histogram per warp with match.any more still:
        H200, 1 x 8K, 14.7 and 16.5 us against 12.1; lane-major copies, whose random bins meet in
        banks, timed the same as these: 10.7 us.) Keys past the run are skipped by a branch the
        whole CTA takes alike. one_barrier: to the CTA's one histogram at ``base``, bin-indexed."""
        lane = tid % 32
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                key = keys[i]
                live = key != Uint32(0)
                if cutlass.const_expr(p > 0):
                    live = live & ((key >> Uint32(shift + RADIX)) == (t >> Uint32(shift + RADIX)))
                if live:
                    if cutlass.const_expr(self.one_barrier):
                        cute.arch.atomic_add(hist.iterator + (base + Int32((key >> Uint32(shift)) & Uint32(BINS - 1))),
                                             Int32(1))
                    else:
                        cute.arch.atomic_add(
                            hist.iterator + (Int32((key >> Uint32(shift)) & Uint32(BINS - 1)) * 32 + lane), Int32(1))

    @cute.jit
    def sum_copies(self, hist: cute.Tensor, parts: cute.Tensor, tid: Int32):
        """parts[q * BINS + b]: bin b summed over the q-th group of lane copies, which this thread
        then clears for the next digit (it is their only reader). Its c-th read is lane
        (q * per + c + b) % 32's: a warp's 32 bins read 32 distinct banks."""
        b = tid % BINS
        q = tid // BINS
        per = 32 // self.parts
        total = Int32(0)
        for c in cutlass.range_constexpr(per):
            at = b * 32 + ((q * per + c + b) & 31)
            total = total + hist[at]
            hist[at] = Int32(0)
        parts[q * BINS + b] = total

    @cute.jit
    def bin_count(self, parts: cute.Tensor, b: Int32) -> Int32:
        total = Int32(0)
        for q in cutlass.range_constexpr(self.parts):
            total = total + parts[q * BINS + b]
        return total
