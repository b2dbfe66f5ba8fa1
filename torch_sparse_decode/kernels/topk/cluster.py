"""Warp and cluster primitives: votes, a warp's place in a CTA-wide compaction, remote reads of
the other CTAs' shared memory (distributed shared memory) and the cluster barrier."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ..cute import warps_before
from .layout import WARPS


@cute.jit
def ballot_of(predicate) -> Uint32:
    return Uint32(cute.arch.vote_ballot_sync(predicate))


@cute.jit
def load_rank(t: cute.Tensor, i: Int32, rank: Int32) -> Int32:
    """``t[i]`` of cluster CTA ``rank`` (distributed shared memory)."""
    address = Int32((t.iterator + i).toint())
    return cute.arch.inline_ptx(
        "{ .reg .u32 remote; mapa.shared::cluster.u32 remote, {$r0}, {$r1}; "
        "ld.shared::cluster.u32 {$w0}, [remote]; }",
        write_only_types=[Int32], read_only_args=[address, Int32(rank)],
    )


@cute.jit
def cluster_sum(t: cute.Tensor, i: Int32, ctas: cutlass.Constexpr[int]) -> Int32:
    """``t[i]`` summed over the first ``ctas`` CTAs of the cluster (all remote loads issued
    before the adds)."""
    v = t[i]
    if cutlass.const_expr(ctas > 1):
        parts = cute.make_rmem_tensor(ctas, Int32)
        for r in cutlass.range_constexpr(ctas):
            parts[r] = load_rank(t, i, r)
        v = Int32(0)
        for r in cutlass.range_constexpr(ctas):
            v = v + parts[r]
    return v


@cute.jit
def cluster_sync(ctas: cutlass.Constexpr[int]):
    """All CTAs of the cluster meet; this CTA's shared-memory writes before it are visible to the
    others' remote reads after it. The release is restricted to shared::cta (what the CTAs
    exchange): a plain cluster arrive releases at GPU scope (MEMBAR.ALL.GPU), ~0.2 us each."""
    if cutlass.const_expr(ctas > 1):
        cute.arch.inline_ptx("fence.release.sync_restrict::shared::cta.cluster;")
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
    else:
        cute.arch.sync_threads()


@cute.jit
def warp_offset(counts: cute.Tensor, mine: Int32, at: Int32, before: Int32, tid: Int32):
    """(``before`` + the lower warps' ``mine``, the sum over every warp): a warp's place in a
    tile's ordered compaction, after publishing its count at ``counts[at + warp]``; one barrier."""
    lane, warp = tid % 32, tid // 32
    if lane == 0:
        counts[at + warp] = mine
    cute.arch.sync_threads()
    below, total = warps_before(counts, warp, WARPS, at)
    return before + below, total
