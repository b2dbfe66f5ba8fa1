"""The short-row select's output (a mixin of ``ShortRowTopk``: ``per``, ``warps``, ``fused``,
``ties_taken``, ``trim``, ``ctas``, ``mark``): the kept ids (keys > t and the first ``take`` keys == t) at
their places, in id order, with no sort.

Id order is warp, then key, then lane: each warp counts its kept keys by ballots, one barrier
gives each warp the counts of the warps below it, and each key's ballots its place among its
warp's: a key > t at (keys > t before it) + min(ties before it, ties taken), a tie iff fewer than
``take`` ties precede it. Nothing is written outside the outputs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ...limits import TOPK_MAX_K
from ..cute import popc
from .cluster import ballot_of, cluster_sync, load_rank


WIDE_SHIFT = 13  # keys > t number fewer than k <= TOPK_MAX_K < 2**13; ties, at most WIDE_MAX < 2**18
assert TOPK_MAX_K < 1 << WIDE_SHIFT


class ShortWrite:
    """Writing the kept ids (see the module docstring)."""

    @cute.jit
    def write_kept(self, keys: cute.Tensor, run: Int32, t: Uint32, take: Int32, ties: Int32, lo: Int32, row: Int32,
                   out: cute.Tensor, staged: cute.Tensor, warp_sums: cute.Tensor, tid: Int32, marks: cute.Tensor):
        """The kept ids at their places in ``out`` (a fused build: in ``staged``): keys > t and the
        first ``take`` keys == t, in id order.
        Id order is warp, then key, then lane: a warp's ballots of each key place its lanes, and
        one barrier gives each warp the counts of the warps below it. A trimmed build that keeps
        all ``ties`` keys equal to t places the keys >= t in one pass (``write_placed``)."""
        if cutlass.const_expr(self.trim):
            if ties == take:  # CTA-uniform
                self.write_placed(keys, run, t, lo, row, out, staged, warp_sums, tid, marks)
            else:
                self.write_counted(keys, run, t, take, lo, row, out, staged, warp_sums, tid, marks)
        else:
            self.write_counted(keys, run, t, take, lo, row, out, staged, warp_sums, tid, marks)
        self.mark(marks, "written")

    @cute.jit
    def warps_below(self, warp_sums: cute.Tensor, lane: Int32, warp: Int32) -> Int32:
        """``warp_sums`` summed over the warps before this one, once every warp has published its
        own: in the CTA, or (``ctas`` > 1) over the cluster's CTAs in rank order, after which this
        CTA reads no other's shared memory (its arrive; the kernel waits before it ends)."""
        below = Int32(0)
        if cutlass.const_expr(self.ctas > 1):
            cluster_sync(self.ctas)
            rank, _, _ = cute.arch.block_idx()
            mine = rank * self.warps + warp
            for q in cutlass.range_constexpr(-(-self.ctas * self.warps // 32)):
                w = lane + 32 * q
                if w < mine:
                    below = below + load_rank(warp_sums, w % self.warps, w // self.warps)
            below = cute.arch.warp_redux_sync(below, "add")
            cute.arch.cluster_arrive_relaxed()
        else:
            cute.arch.sync_threads()
            below = cute.arch.warp_redux_sync(cutlass.select_(lane < warp, warp_sums[lane % self.warps], Int32(0)),
                                              "add")
        return below

    @cute.jit
    def write_placed(self, keys: cute.Tensor, run: Int32, t: Uint32, lo: Int32, row: Int32, out: cute.Tensor,
                     staged: cute.Tensor, warp_sums: cute.Tensor, tid: Int32, marks: cute.Tensor):
        """Every key >= t at its place: one ballot a key gives its place among its warp's (kept in
        registers while the keys are let go), one barrier the warps' bases."""
        lane, warp = tid % 32, tid // 32
        below = Uint32(cute.arch.lanemask_lt())
        places = cute.make_rmem_tensor(self.per, Int32)  # among the warp's kept keys; -1: not kept
        kept = Int32(0)
        for i in cutlass.range_constexpr(self.per):
            places[i] = Int32(-1)
            if run > i:
                keep = keys[i] >= t
                votes = ballot_of(keep)
                places[i] = cutlass.select_(keep, kept + popc(votes & below), Int32(-1))
                kept = kept + popc(votes)
        if lane == 0:
            warp_sums[warp] = kept
        base = self.warps_below(warp_sums, lane, warp)
        self.mark(marks, "counts")
        width = out.shape[1]
        if cutlass.const_expr(self.fused):
            width = min(width, Int32(TOPK_MAX_K + 1))  # the staging's size
        ids = out[row, None]
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                slot = base + places[i]
                if (places[i] >= 0) & (slot < width):
                    if cutlass.const_expr(self.fused):
                        staged[slot] = lo + 32 * i
                    else:
                        ids[slot] = lo + 32 * i

    @cute.jit
    def write_counted(self, keys: cute.Tensor, run: Int32, t: Uint32, take: Int32, lo: Int32, row: Int32,
                      out: cute.Tensor, staged: cute.Tensor, warp_sums: cute.Tensor, tid: Int32, marks: cute.Tensor):
        """``write_kept`` from each warp's counts of keys > t and == t."""
        lane, warp = tid % 32, tid // 32
        below = Uint32(cute.arch.lanemask_lt())
        # keys > t (the low bits, < k) and == t (the high): 16 and 16, or a wide row's (more than 2**15
        # keys: its ties' sums need more) 13 and 19
        shift = 16 if self.ctas * self.threads * self.per <= 1 << 15 else WIDE_SHIFT
        counts = Int32(0)
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                counts = counts + popc(ballot_of(keys[i] > t)) + (popc(ballot_of(keys[i] == t)) << shift)
        if lane == 0:
            warp_sums[warp] = counts
        before = self.warps_below(warp_sums, lane, warp)
        self.mark(marks, "counts")
        kept_before = before & Int32((1 << shift) - 1)
        tied_before = before >> shift
        width = out.shape[1]
        if cutlass.const_expr(self.fused):
            width = min(width, Int32(TOPK_MAX_K + 1))  # the staging's size
        if cutlass.const_expr(self.ties_taken and not self.trim):  # trim: the search said not every tie is kept
            total = cute.arch.warp_redux_sync(cutlass.select_(lane < self.warps, warp_sums[lane % self.warps],
                                                              Int32(0)), "add")
            if (total >> shift) == take:  # CTA-uniform; random rows: t is one key, and kept
                self.write_at_least(keys, run, t, kept_before + tied_before, lo, below, out[row, None], staged, width)
            else:
                self.write_places(keys, run, t, take, lo, row, below, kept_before, tied_before, out, staged, width)
        else:
            self.write_places(keys, run, t, take, lo, row, below, kept_before, tied_before, out, staged, width)

    @cute.jit
    def write_at_least(self, keys: cute.Tensor, run: Int32, t: Uint32, kept_before: Int32, lo: Int32, below: Uint32,
                       ids: cute.Tensor, staged: cute.Tensor, width: Int32):
        """Every key >= t at its place (the CTA keeps every key equal to t): one ballot a key, the
        row's ids addressed from its base."""
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                kept = keys[i] >= t
                votes = ballot_of(kept)
                slot = kept_before + popc(votes & below)
                if kept & (slot < width):
                    if cutlass.const_expr(self.fused):
                        staged[slot] = lo + 32 * i
                    else:
                        ids[slot] = lo + 32 * i
                kept_before = kept_before + popc(votes)

    @cute.jit
    def write_places(self, keys: cute.Tensor, run: Int32, t: Uint32, take: Int32, lo: Int32, row: Int32,
                     below: Uint32, kept_before: Int32, tied_before: Int32, out: cute.Tensor, staged: cute.Tensor,
                     width: Int32):
        """Keys > t and the first ``take`` keys == t at their places: two ballots a key."""
        for i in cutlass.range_constexpr(self.per):
            if run > i:
                above = keys[i] > t
                at_t = keys[i] == t
                above_votes = ballot_of(above)
                tie_votes = ballot_of(at_t)
                mine_kept = kept_before + popc(above_votes & below)
                mine_tied = tied_before + popc(tie_votes & below)
                slot = mine_kept + min(mine_tied, take)
                if (above | (at_t & (mine_tied < take))) & (slot < width):  # exact counts never fail the last
                    if cutlass.const_expr(self.fused):
                        staged[slot] = lo + 32 * i
                    else:
                        out[row, slot] = lo + 32 * i
                kept_before = kept_before + popc(above_votes)
                tied_before = tied_before + popc(tie_votes)
