"""The digit search: the k_sel-th largest key t, one radix digit at a time (11, 11 and 10
bits). Every CTA histograms its span's keys that match the digits found so far (shared-memory
atomics) and the digit is read off the cluster's summed histogram through distributed shared
memory, in two rounds of few remote loads (512 coarse bins, then the chosen one's fine bins).
Every CTA also learns how many of its own keys are above t and equal to t. The two-pass path's
copy (the keys at or above t's first-digit bucket, in index order) is counted here too."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ..cute import block_exclusive
from .cluster import ballot_of, cluster_sum, cluster_sync, load_rank, warp_offset
from .keys import DIGITS, digit_of, digit_shift, in_prefix
from .layout import BINS, CAP, FINE, NO_COPY, PER, THREADS, WARPS, Scratch
from .stream import Regs, Span


class DigitSearch:
    """Counting digits over the span or its copy, and reading them off the cluster (a mixin of
    ``RadixTopk``: ``ctas``, ``ord16``)."""

    @cute.jit
    def count_digit(self, src: cute.Tensor, sm: Scratch, span: Span, refetch, p: cutlass.Constexpr[int], t: Uint32,
                    regs: Regs, tid: Int32, high: Uint32 = NO_COPY):
        """Histogram digit p (0, 1, 2) of the span's keys whose higher digits equal t's; for p = 1
        also the AND and the OR of those keys (``bounds``): equal over the cluster, they are t;
        and a copy of the keys >= ``high`` (those above the first digit's bucket), as the gated
        pass copies, for an output stage that then need not read the row for them.

        The first digit counts every slot without a branch: a missing key (0) lands in bin 0,
        which no score reaches (-inf's key is in bin 3), so the digit search never picks it."""
        hist, keys = sm.hist, regs.keys
        every, some = Uint32(0xFFFFFFFF), Uint32(0)  # AND and OR: two logic ops a key, not compares
        self.begin_pass(src, sm.ring, span, refetch, tid)
        for tile in range(span.tiles):
            self.next_tile(src, sm.ring, span, tile, refetch, regs, tid)
            for i in cutlass.range_constexpr(PER):
                if cutlass.const_expr(p == 0):
                    cute.arch.atomic_add(hist.iterator + digit_of(keys[i], 0), Int32(1))
                elif in_prefix(keys[i], t, p):
                    cute.arch.atomic_add(hist.iterator + (p * BINS + digit_of(keys[i], p)), Int32(1))
                    if cutlass.const_expr(p == 1 and not self.ord16):  # ord16 rows never read them
                        every, some = every & keys[i], some | keys[i]
            if cutlass.const_expr(p == 1 and not self.ord16):
                if high != NO_COPY:  # one build of the loop for both: a second costs long rows 15%
                    self.append_tile(regs, high, tile, sm, tid)
        if cutlass.const_expr(p == 1 and not self.ord16):
            every = cute.arch.warp_redux_sync(every, "and")
            some = cute.arch.warp_redux_sync(some, "or")
            if tid % 32 == 0:
                cute.arch.atomic_and(sm.bounds.iterator, every)
                cute.arch.atomic_or(sm.bounds.iterator + 1, some)
        cute.arch.sync_threads()

    @cute.jit
    def single_valued(self, sm: Scratch, tid: Int32):
        """(whether every key that the cluster's digit-1 pass counted is one value, that value),
        from ``bounds`` after the digit search's cluster barrier: lane l of each warp reads one
        word of CTA l // 2, so a warp issues one remote load."""
        lane = tid % 32
        at = lane % 2
        v = sm.bounds[at]
        if cutlass.const_expr(self.ctas > 1):
            v = Uint32(load_rank(sm.bounds, at, min(lane // 2, Int32(self.ctas - 1))))
        every = cute.arch.warp_redux_sync(Uint32(cutlass.select_(at == 0, v, Uint32(0xFFFFFFFF))), "and")
        some = cute.arch.warp_redux_sync(Uint32(cutlass.select_(at == 1, v, Uint32(0))), "or")
        return Int32(every == some), some

    @cute.jit
    def copy_tile(self, regs: Regs, t: Uint32, sm: Scratch, written: Int32, parity: Int32, tid: Int32) -> Int32:
        """Copy a tile's keys >= t (t: the first digit's bucket, > 0) and their ids after the
        ``written`` before them, in index order, and histogram the second digit of those in the
        bucket. Returns how many it copied.

        Few keys reach the bucket, so a 32-key group without one costs a compare, a vote and a
        popcount; the atomics and the stores run under a warp-uniform branch."""
        keys, ids = regs.keys, regs.ids
        lane = tid % 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        kept_at = parity * 2 * WARPS
        votes = cute.make_rmem_tensor(PER, Uint32)
        kept_n = Int32(0)
        for i in cutlass.range_constexpr(PER):
            votes[i] = ballot_of(keys[i] >= t)
            kept_n = kept_n + Int32(cute.arch.popc(votes[i]))
        slot, added = warp_offset(sm.counts, kept_n, kept_at, written, tid)
        for i in cutlass.range_constexpr(PER):
            if votes[i] != Uint32(0):
                if keys[i] >= t:
                    at = slot + Int32(cute.arch.popc(votes[i] & lower))
                    sm.buf_key[at] = keys[i]
                    sm.buf_id[at] = ids[i]
                    if in_prefix(keys[i], t, 1):
                        cute.arch.atomic_add(sm.hist.iterator + (BINS + digit_of(keys[i], 1)), Int32(1))
                slot = slot + Int32(cute.arch.popc(votes[i]))
        return added

    @cute.jit
    def find_digit(self, sm: Scratch, base: Int32, need: Int32, tid: Int32, local: cutlass.Constexpr[bool] = False):
        """(d, above, own): the digit d whose bin, counting down from the top bin of the cluster's
        histograms at ``base`` (this CTA's alone with ``local``), reaches ``need``; how many keys
        the bins above d hold; this thread's share of this CTA's keys in them. Two rounds of
        remote reads: THREADS coarse bins, then the FINE bins of the chosen one (remote loads are
        slow, so each thread issues few)."""
        hist, coarse, fine, result, warp_sums = sm.hist, sm.coarse, sm.fine, sm.result, sm.warp_sums
        ctas = 1 if local else self.ctas
        slot = base // BINS * THREADS
        mine = Int32(0)
        for b in cutlass.range_constexpr(FINE):
            mine = mine + hist[base + tid * FINE + (b + tid) % FINE]  # rotated: fewer bank conflicts
        coarse[slot + tid] = mine
        cluster_sync(ctas)
        # Coarse bin c covers bins [c * FINE, (c + 1) * FINE); thread THREADS-1-c scans it so the
        # exclusive scan counts the bins above.
        from_top = THREADS - 1 - tid
        mirrored = cluster_sum(coarse, slot + from_top, ctas)
        above, _ = block_exclusive(mirrored, warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        if (above < need) & (above + mirrored >= need):
            result[0] = from_top
            result[1] = above
        cute.arch.sync_threads()
        chosen = result[0]
        if tid < FINE:
            fine[tid] = cluster_sum(hist, base + chosen * FINE + tid, ctas)
        cute.arch.sync_threads()
        if tid == 0:
            run = result[1]
            found = Int32(0)
            for b in cutlass.range_constexpr(FINE):
                v = fine[FINE - 1 - b]
                if (found == 0) & (run + v >= need):
                    result[0] = chosen * FINE + FINE - 1 - b
                    result[1] = run
                    found = Int32(1)
                run = run + v
        cute.arch.sync_threads()
        digit = result[0]
        above = result[1]
        own = Int32(0)
        if tid > chosen:
            own = coarse[slot + tid]
        if tid < FINE:
            if chosen * FINE + tid > digit:
                own = own + hist[base + chosen * FINE + tid]
        cute.arch.sync_threads()
        return digit, above, own

    @cute.jit
    def digits_from_copy(self, first: cutlass.Constexpr[int], sm: Scratch, kept: Int32, t: Uint32, need: Int32,
                         above_part: Int32, tid: Int32, src=None, span=None, refetch=None, regs=None, bucket=None,
                         gate=None, at_gate=None):
        """Digits ``first``.. of t (with its digits above already in ``t``), counted from the copy,
        which holds every key of the span >= t. From digit 0 (the one-read path) the copy holds
        the keys above ``gate`` and ``at_gate`` keys equal to it are counted as well. From digit
        1 (the two-pass path) the second digit is already counted, and a span too tie-heavy to
        copy counts the third over the row, unless the keys of the first digit's bucket
        (``bucket`` of them in the cluster) all share their second digit and the pass over them
        found them one value (then that is t).
        Returns (t, how many keys == t the best k_sel take, this CTA's keys > t, its keys == t)."""
        last = 1 if self.ord16 else 2
        if cutlass.const_expr(first == 0):
            for p in range(last + 1):
                self.count_copied(sm, kept, t, p, tid, gate, at_gate)
                cute.arch.sync_threads()
                digit, above, own = self.find_digit(sm, p * BINS, need, tid)
                need = need - above
                above_part = above_part + own
                t = t | (Uint32(digit) << Uint32(digit_shift(p)))
            tied = sm.hist[last * BINS + digit_of(t, last)]
        else:
            settled = Int32(0)
            tied_at = Int32(0)  # the histogram bin that holds this CTA's keys == t
            for p in range(1, last + 1):
                if settled == 0:
                    if p == 2:
                        if kept <= CAP:
                            self.count_copied(sm, kept, t, p, tid)
                        else:
                            self.count_digit(src, sm, span, refetch, 2, t, regs, tid)
                        cute.arch.sync_threads()
                    digit, above, own = self.find_digit(sm, p * BINS, need, tid)
                    need = need - above
                    above_part = above_part + own
                    t = t | (Uint32(digit) << Uint32(digit_shift(p)))
                    tied_at = p * BINS + digit
                    if cutlass.const_expr(not self.ord16):
                        if (p == 1) & (sm.fine[digit % FINE] == bucket):  # the same in every CTA
                            settled, value = self.single_valued(sm, tid)
                            t = Uint32(cutlass.select_(settled != 0, value, t))
            tied = sm.hist[tied_at]
        _, mine_above = block_exclusive(above_part, sm.warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        return t, need, mine_above, tied

    @cute.jit
    def count_copied(self, sm: Scratch, kept: Int32, t: Uint32, p: Int32, tid: Int32, extra=None, extra_n=None):
        """Histogram digit p (0, 1, 2; not a constant) of the copied keys whose higher digits
        equal t's, and ``extra_n`` more keys equal to ``extra`` (keys counted, not copied).
        Copied keys are live."""
        shift = digit_shift(p)
        mask = cutlass.select_(p == 2, Uint32((1 << DIGITS[2][1]) - 1), Uint32((1 << DIGITS[1][1]) - 1))
        above = Uint32(cutlass.select_(p == 1, Int32(DIGITS[0][0]), Int32(DIGITS[1][0])))  # higher digits', p >= 1
        for j in range(tid, kept, THREADS):
            key = sm.buf_key[j]
            if (p == 0) | ((key >> above) == (t >> above)):
                cute.arch.atomic_add(sm.hist.iterator + (p * BINS + Int32((key >> Uint32(shift)) & mask)), Int32(1))
        if cutlass.const_expr(extra is not None):
            if (tid == 0) & (extra_n > 0) & ((p == 0) | ((extra >> above) == (t >> above))):
                cute.arch.atomic_add(sm.hist.iterator + (p * BINS + Int32((extra >> Uint32(shift)) & mask)), extra_n)
