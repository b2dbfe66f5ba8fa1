"""The one-read path for spans of more than ONE_READ_FROM keys: the first pass copies each key
above a gate, guessed from the CTA's first tile to leave about twice its share of the best k_sel
above it, with no CTA barrier (warps claim room; the parts are put in index order after the
pass), and counts the keys equal to the gate; the digits are read off the copies and those
counts alone. Where tile 0's chosen first-digit bin holds most of the tile (narrow rows, tie-heavy
rows), the gate is the tile's exact key of that rank. The answer is exact when every CTA's gate
is <= t, which is checked; where it fails, the CTAs whose copies lack keys >= t copy again with a
gate guessed from a sample of their whole span, checked the same way (else the two passes)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from ..cute import block_exclusive, copy_async16, zero_fill
from .cluster import ballot_of, cluster_sync, load_rank
from .keys import DIGITS, digit_of, in_prefix
from .layout import BINS, CAP, ID_BITS, PER, THREADS, TILE, WARPS, Scratch
from .stream import Regs, Span


class OneRead:
    """The gated copy and its gate (a mixin of ``RadixTopk``: ``source``)."""

    @cute.jit
    def append_tile(self, regs: Regs, gate: Uint32, j: Int32, sm: Scratch, tid: Int32) -> Int32:
        """The gated pass's copy of tile j, with no CTA barrier: the warp claims room for its keys
        >= gate (one shared atomic) and writes them there in index order, each id tagged with its
        (tile, warp) part; ``segments`` records where each part went and its size. Returns the
        claims so far as this warp saw them."""
        keys, ids = regs.keys, regs.ids
        claimed, segments, buf_key, buf_id = sm.claimed, sm.segments, sm.buf_key, sm.buf_id
        lane, warp = tid % 32, tid // 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        votes = cute.make_rmem_tensor(PER, Uint32)
        kept_n = Int32(0)
        for i in cutlass.range_constexpr(PER):
            votes[i] = ballot_of(keys[i] >= gate)
            kept_n = kept_n + Int32(cute.arch.popc(votes[i]))
        start = Int32(0)
        if kept_n > 0:
            if lane == 0:
                start = cute.arch.atomic_add(claimed.iterator, kept_n)
            start = cute.arch.shuffle_sync(start, 0)
            slot = start
            for i in cutlass.range_constexpr(PER):
                if votes[i] != Uint32(0):
                    at = slot + Int32(cute.arch.popc(votes[i] & lower))
                    if (keys[i] >= gate) & (at < CAP):
                        buf_key[at] = keys[i]
                        buf_id[at] = Int32((Uint32(j * WARPS + warp) << Uint32(ID_BITS)) | Uint32(ids[i]))
                    slot = slot + Int32(cute.arch.popc(votes[i]))
        if lane == 0:
            segments[j * WARPS + warp] = (start << 16) | kept_n
        return start + kept_n

    @cute.jit
    def in_index_order(self, tiles: Int32, sm: Scratch, copied: Int32, tid: Int32, to: Int32 = 0):
        """Put the gated pass's copy in index order, at ``to``..: a (tile, warp) part goes after
        every part of the tiles before it and of the lower warps in its tile. One scan of the part
        sizes turns ``segments`` into each part's shift; every entry then moves by its part's
        shift, staged through the ring (free after the pass)."""
        segments, buf_key, buf_id, warp_sums = sm.segments, sm.buf_key, sm.buf_id, sm.warp_sums
        parts = tiles * WARPS
        each = (parts + THREADS - 1) // THREADS
        mine = Int32(0)
        for q in range(each):
            if tid * each + q < parts:
                mine = mine + (segments[tid * each + q] & 0xFFFF)
        run, _ = block_exclusive(mine, warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        for q in range(each):
            if tid * each + q < parts:
                part = segments[tid * each + q]
                segments[tid * each + q] = run - (part >> 16)
                run = run + (part & 0xFFFF)
        cute.arch.sync_threads()
        staged = cute.recast_tensor(sm.ring, Int32)
        for e in range(tid, copied, THREADS):
            tagged = Uint32(buf_id[e])
            at = e + segments[Int32(tagged >> Uint32(ID_BITS))]
            staged[at] = Int32(buf_key[e])
            staged[CAP + at] = Int32(tagged & Uint32((1 << ID_BITS) - 1))
        self.unstage(sm, copied, to, tid)

    @cute.jit
    def to_end(self, sm: Scratch, n: Int32, tid: Int32):
        """Move the copy's n entries from buf[0, n) to buf[CAP - n, CAP), staged through the ring
        (free after the gated pass)."""
        staged = cute.recast_tensor(sm.ring, Int32)
        for e in range(tid, n, THREADS):
            staged[e] = Int32(sm.buf_key[e])
            staged[CAP + e] = sm.buf_id[e]
        self.unstage(sm, n, CAP - n, tid)

    @cute.jit
    def unstage(self, sm: Scratch, n: Int32, to: Int32, tid: Int32):
        """buf[to, to + n) from the n entries staged in the ring (keys from 0, ids from CAP),
        between CTA barriers."""
        staged = cute.recast_tensor(sm.ring, Int32)
        cute.arch.sync_threads()
        for e in range(tid, n, THREADS):
            sm.buf_key[to + e] = Uint32(staged[e])
            sm.buf_id[to + e] = staged[CAP + e]
        cute.arch.sync_threads()

    @cute.jit
    def gated_copy(self, src: cute.Tensor, sm: Scratch, span: Span, target: Int32, sampled: cutlass.Constexpr[bool],
                   regs: Regs, tid: Int32):
        """The one-read path's pass: copy the span's keys >= a gate, in index order (every key
        when the span fits the copy, gate 0; else a gate guessed to leave about ``target`` above
        it, from tile 0, or with ``sampled`` from a sample of the whole span). Where the guess
        says the keys equal to the gate are many (it is a tied value), copy the keys above it and
        count those equal to it: that keeps the copy small on tie-heavy rows (narrow rows, whose
        ties are few, copy them).
        Warps run through it with no CTA barrier after tile 0 and stop once the copy overflows.
        Returns (how many keys it copied, > CAP if it overflowed; the gate; how many equal to it
        it counted, not copied). Leaves the ring overwritten."""
        gate = Uint32(0)
        counts_ties = Int32(0)  # 1: keys == gate are counted, not copied
        seen = Int32(0)
        tied = Int32(0)  # this thread's keys == gate
        guessed = span.hi - span.lo > CAP
        if cutlass.const_expr(sampled):
            if guessed:  # before the pass: the tile loop stays as it was
                self.fetch_sample(src, sm, span, tid)
                cute.arch.cp_async_wait_group(0)
                self.sample_keys(sm, span, regs, tid)
                gate, counts_ties = self.guess_gate(regs, span, target, True, sm, tid)
        self.begin_pass(src, sm.ring, span, True, tid)
        for tile in range(span.tiles):
            if seen <= CAP:
                self.next_tile(src, sm.ring, span, tile, True, regs, tid)
                if cutlass.const_expr(not sampled):
                    if (tile == 0) & guessed:
                        gate, counts_ties = self.guess_gate(regs, span, target, False, sm, tid)
                seen = self.append_tile(regs, gate + Uint32(counts_ties), tile, sm, tid)
                for i in cutlass.range_constexpr(PER):
                    tied = tied + Int32(regs.keys[i] == gate)
        tied = cute.arch.warp_redux_sync(tied, "add")
        if (tid % 32 == 0) & (counts_ties != 0):
            cute.arch.atomic_add(sm.claimed.iterator + 1, tied)
        cute.arch.cp_async_wait_group(0)  # nothing left in flight into the ring
        cute.arch.sync_threads()
        copied = sm.claimed[0]
        if copied <= CAP:
            self.in_index_order(span.tiles, sm, copied, tid)
        return copied, gate, sm.claimed[1]

    @cute.jit
    def sample_at(self, span: Span, tid: Int32) -> Int32:
        """Where thread tid's chunk of the gate's sample starts: tid / THREADS of the way through
        the span, rounded down to 16 bytes in memory as the tiles are (``base`` is aligned)."""
        vec = 16 // (self.source.width // 8)
        p = span.lo + Int32(Int64(tid) * Int64(span.hi - span.lo) // Int64(THREADS))
        return p - (p - span.base) % vec

    @cute.jit
    def fetch_sample(self, src: cute.Tensor, sm: Scratch, span: Span, tid: Int32):
        """Start copying the gate's sample, one 16-byte chunk a thread spread evenly over the span,
        into ``buf_id`` (free until the gated pass copies)."""
        size = self.source.width // 8
        at = self.sample_at(span, tid)
        chunk = Int64((src.iterator + (span.row_off + Int64(at))).toint())
        copy_async16(Int32((sm.buf_id.iterator + tid * 4).toint()), chunk, min(span.hi - at, Int32(16 // size)) * size)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def sample_keys(self, sm: Scratch, span: Span, regs: Regs, tid: Int32):
        """The sample's keys (``fetch_sample``, complete) in this thread's first slots of ``keys``,
        0 (no key) in the rest and outside [lo, hi)."""
        vec = 16 // (self.source.width // 8)
        at = self.sample_at(span, tid)
        raw = cute.recast_tensor(sm.buf_id, self.source)
        for i in cutlass.range_constexpr(PER):
            if cutlass.const_expr(i < vec):
                inside = (at + i >= span.lo) & (at + i < span.hi)
                regs.keys[i] = Uint32(cutlass.select_(inside, self.key_of(raw[tid * vec + i]), Uint32(0)))
            else:
                regs.keys[i] = Uint32(0)

    @cute.jit
    def guess_gate(self, regs: Regs, span: Span, target: Int32, sampled: cutlass.Constexpr[bool], sm: Scratch,
                   tid: Int32):
        """A key g with about ``target`` of the span's keys at or above it, read off tile 0 or,
        with ``sampled``, the sample (``keys``): the first digit's histogram of those keys, then a
        straight line through the chosen bin; where that bin holds most of them (narrow or
        tie-heavy rows, where a line through it means nothing), their exact key of that rank
        from two more local digits.
        Only a guess: the one-read path checks it afterwards. Returns (the gate, whether the
        gated pass counts the keys equal to it instead of copying them: where the tile holds
        many keys equal to an exact gate, as on rows of one or few values and ReLU zeros)."""
        hi, lo = span.hi, span.lo
        sample = min(hi, span.base + TILE) - lo
        if cutlass.const_expr(sampled):
            sample = Int32(THREADS * (16 // (self.source.width // 8)))
        r = Int32((Int64(target) * Int64(sample) + Int64(hi - lo - 1)) // Int64(hi - lo))
        for i in cutlass.range_constexpr(PER):
            cute.arch.atomic_add(sm.hist.iterator + (2 * BINS + digit_of(regs.keys[i], 0)), Int32(1))
        cute.arch.sync_threads()
        d, above, _ = self.find_digit(sm, Int32(2 * BINS), r, tid, local=True)
        in_bin = Int64(sm.hist[2 * BINS + d])
        shift = DIGITS[0][0]  # a first-digit bin holds 2**shift keys
        inside = (in_bin - Int64(r - above)) * Int64(1 << shift) // in_bin
        gate = Uint32((Int64(d) << Int64(shift)) + inside)
        counts_ties = Int32(0)
        if in_bin > 4 * Int64(r):  # histograms 1 and 0 are still zero (the gated pass runs first)
            g = Uint32(d) << Uint32(shift)
            need = r - above
            for p in cutlass.range_constexpr(1, 3):
                for i in cutlass.range_constexpr(PER):
                    if in_prefix(regs.keys[i], g, p):
                        cute.arch.atomic_add(sm.hist.iterator + ((2 - p) * BINS + digit_of(regs.keys[i], p)), Int32(1))
                cute.arch.sync_threads()
                d, above, _ = self.find_digit(sm, Int32((2 - p) * BINS), need, tid, local=True)
                need = need - above
                g = g | (Uint32(d) << Uint32(DIGITS[p][0]))
            gate = g
            # The tile's keys == g (its last digit's bin), scaled to the span: where they would
            # fill half the copy's room beyond the target (rows of one or few values, ReLU
            # zeros), count them instead. Narrow rows have few keys a value: those are copied,
            # so a CTA whose gate turns out to be t needs no second read for its ties.
            ties_in_span = Int64(sm.hist[digit_of(g, 2)]) * Int64(hi - lo)
            counts_ties = Int32(2 * ties_in_span > Int64(CAP - target) * Int64(sample))
        return gate, counts_ties

    @cute.jit
    def read_once(self, src: cute.Tensor, sm: Scratch, span: Span, k_sel: Int32, target: Int32, regs: Regs,
                  marks: cute.Tensor, tid: Int32, kept: Int32, t: Uint32, take: Int32, mine_above: Int32,
                  mine_tied: Int32, found: Int32, above_only: Int32):
        """The one-read path: (kept, t, take, mine_above, mine_tied, found, above_only), ``found``
        0 where neither attempt proved its copies hold every key >= t (then the two passes run).
        Where the first attempt fails, a second before the two passes: each CTA whose copy lacks
        some of its keys >= t (it overflowed, its gate is above t, or the copies held fewer than
        k_sel) copies again, its gate guessed from a sample of its whole span for up to CAP * 3 / 4
        keys. Rising, falling and trending rows, whose first tiles are not like the rest, pay it;
        rows that the first attempt answers do not."""
        hist, shared, claimed, gate_ties = sm.hist, sm.shared, sm.claimed, sm.gate_ties
        gate, at_gate = Uint32(0), Int32(0)
        redo = Int32(1)
        again = Int32(1)
        copied, gates = cute.make_rmem_tensor(self.ctas, Int32), cute.make_rmem_tensor(self.ctas, Uint32)
        ties = cute.make_rmem_tensor(self.ctas, Int32)
        # Unrolled: as a runtime loop the first attempt's pass ran slower (64x1M rows whose
        # ties at the gate are counted: 96 us against 82).
        for attempt in cutlass.range_constexpr(2):
            if again != 0:
                if redo != 0:
                    kept, gate, at_gate = self.gated_copy(src, sm, span,
                                                          target if attempt == 0 else Int32(CAP * 3 // 4),
                                                          attempt == 1, regs, tid)
                    if tid == 0:
                        shared[2] = kept
                        shared[3] = Int32(gate)
                        gate_ties[0] = at_gate
                self.mark(marks, "gated pass + index order")
                zero_fill(hist, 3 * BINS, tid, THREADS)
                cluster_sync(self.ctas)
                for r in cutlass.range_constexpr(self.ctas):
                    copied[r] = load_rank(shared, Int32(2), r)
                    gates[r] = Uint32(load_rank(shared, Int32(3), r))
                    ties[r] = load_rank(gate_ties, Int32(0), r)
                total = Int32(0)
                fits = Int32(1)
                highest = gates[0]
                for r in cutlass.range_constexpr(self.ctas):
                    total = total + copied[r] + ties[r]
                    fits = fits & Int32(copied[r] <= CAP)
                    # Not max(): the DSL's max of a constant Uint32 and a key compares signed.
                    highest = cutlass.select_(gates[r] > highest, gates[r], highest)
                self.mark(marks, "exchange")
                if (total >= k_sel) & (fits == 1):
                    t, take, mine_above, mine_tied = self.digits_from_copy(0, sm, kept, Uint32(0), k_sel,
                                                                           Int32(0), tid, gate=gate,
                                                                           at_gate=at_gate)
                    found = Int32(t >= highest)
                    # The copy lacks this CTA's keys == t when t is its gate and they were
                    # counted: the output streams the span for them (until its share is out).
                    above_only = Int32((t >= highest) & (t == gate) & (at_gate > 0))
                    self.mark(marks, "digits from the copies")
                if found == 0:
                    cluster_sync(self.ctas)  # the others are done reading this CTA's words
                    zero_fill(hist, 3 * BINS, tid, THREADS)
                    if tid == 0:
                        claimed[0] = Int32(0)
                        claimed[1] = Int32(0)
                    cute.arch.sync_threads()
                    if cutlass.const_expr(attempt == 0):
                        self.mark(marks, "first attempt failed")
                if cutlass.const_expr(attempt == 0):
                    # t is 0 unless the digits ran (fits): then every CTA but the overflowed
                    # ones keeps its copy.
                    redo = Int32((kept > CAP) | ((fits == 1) & ((total < k_sel) | (gate > t))))
                    again = Int32(found == 0)
        return kept, t, take, mine_above, mine_tied, found, above_only
