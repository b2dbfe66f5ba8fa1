"""CuTe DSL device helpers shared by the kernels (inlined where they are called)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32


@cute.jit
def copy_async16(dst: Int32, src: Int64, nbytes: Int32):
    """cp.async of 16 bytes from global ``src`` to shared ``dst``, of which the first ``nbytes``
    are read and the rest zero-filled (both addresses 16-byte aligned)."""
    cute.arch.inline_ptx("cp.async.cg.shared.global [{$r0}], [{$r1}], 16, {$r2};", read_only_args=[dst, src, nbytes])


@cute.jit
def load_global16(src: Int64):
    """16 bytes of read-only global memory at ``src`` (16-byte aligned) as four 32-bit words."""
    return cute.arch.inline_ptx("ld.global.nc.v4.u32 { {$w0}, {$w1}, {$w2}, {$w3} }, [{$r0}];",
                                write_only_types=[Uint32] * 4, read_only_args=[src])


@cute.jit
def load_shared16(src: Int32):
    """16 bytes of shared memory at ``src`` (16-byte aligned) as four 32-bit words."""
    return cute.arch.inline_ptx("ld.shared.v4.u32 { {$w0}, {$w1}, {$w2}, {$w3} }, [{$r0}];",
                                write_only_types=[Uint32] * 4, read_only_args=[src])


@cute.jit
def popc(x: Uint32) -> Int32:
    return Int32(cute.arch.popc(x))


@cute.jit
def warp_min(x: Int32) -> Int32:
    return cute.arch.inline_ptx("redux.sync.min.s32 {$w0}, {$r0}, 0xffffffff;", write_only_types=[Int32],
                                read_only_args=[x])


@cute.jit
def warp_max(x: Int32) -> Int32:
    return cute.arch.inline_ptx("redux.sync.max.s32 {$w0}, {$r0}, 0xffffffff;", write_only_types=[Int32],
                                read_only_args=[x])


@cute.jit
def warps_before(counts: cute.Tensor, warp: Int32, warps: cutlass.Constexpr[int], base: Int32 = 0):
    """(sum of ``counts[base + w]`` over the warps below ``warp``, sum over all ``warps``): a
    warp's offset in a CTA-wide compaction and the CTA's total."""
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(warps):
        part = counts[base + w]
        if w < warp:
            before = before + part
        total = total + part
    return before, total


@cute.jit
def warp_inclusive(value: Int32, lane: Int32) -> Int32:
    """Sum of ``value`` over this lane and the lower ones."""
    for s in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_up(value, offset=1 << s)
        if lane >= (1 << s):
            value = value + other
    return value


@cute.jit
def block_exclusive(value: Int32, warp_sums: cute.Tensor, tid: Int32, warps: cutlass.Constexpr[int]):
    """(sum of ``value`` over the lower threads, sum over the CTA): one barrier, then each warp
    scans the warp sums itself. ``warp_sums`` must not be written again before another barrier."""
    lane, warp = tid % 32, tid // 32
    inclusive = warp_inclusive(value, lane)
    if lane == 31:
        warp_sums[warp] = inclusive
    cute.arch.sync_threads()
    part = cutlass.select_(lane < warps, warp_sums[lane % warps], Int32(0))
    parts = warp_inclusive(part, lane)
    before = cute.arch.shuffle_sync(parts - part, warp)
    return before + inclusive - value, cute.arch.shuffle_sync(parts, warps - 1)


@cute.jit
def scan_from_top(count_of: cutlass.Constexpr, need: Int32, cap: Int32, info: cute.Tensor, lane: Int32):
    """One warp over 256 bins, ``count_of(b)`` the count of bin b: the bin where the count from the
    top bin down reaches ``need`` (need < 0: min(all, ``cap``)) into ``info[0]``, the count in the
    bins above it into ``info[1]`` and the need into ``info[2]``. Lane l holds bins 255 - 8l ..
    248 - 8l; the first lane whose bins reach the need walks them. (One warp and a barrier:
    every warp scanning for itself was slower, the phases are bound by instruction issue.)"""
    mine = Int32(0)
    for b in cutlass.range_constexpr(8):
        mine = mine + count_of(255 - 8 * lane - b)
    inclusive = warp_inclusive(mine, lane)
    if need < 0:
        need = min(cute.arch.shuffle_sync(inclusive, 31), cap)
    reached = Uint32(cute.arch.vote_ballot_sync(inclusive >= need))
    if lane == popc((reached & (Uint32(0) - reached)) - Uint32(1)):
        run = inclusive - mine
        found = Int32(0)
        for b in cutlass.range_constexpr(8):
            v = count_of(255 - 8 * lane - b)
            if (found == 0) & (run + v >= need):
                info[0] = 255 - 8 * lane - b
                info[1] = run
                found = Int32(1)
            run = run + v
        info[2] = need


@cute.jit
def zero_fill(t: cute.Tensor, words: cutlass.Constexpr[int], tid: Int32, threads: cutlass.Constexpr[int]):
    """``t[:words] = 0``, the CTA's threads striding through it."""
    for i in cutlass.range_constexpr(-(-words // threads)):
        if cutlass.const_expr((i + 1) * threads <= words):
            t[i * threads + tid] = Int32(0)
        elif i * threads + tid < words:
            t[i * threads + tid] = Int32(0)


# Profiled builds stamp the SM clock at the end of each named phase into ``marks``: slot 0 is the
# kernel's start, slot i + 1 the end of ``phases[i]`` (a phase the row does not take reads 0).


def phase_slot(phases: tuple, phase: str) -> int:
    return 0 if phase == "start" else phases.index(phase) + 1


@cute.jit
def stamp(marks: cute.Tensor, phases: cutlass.Constexpr, phase: cutlass.Constexpr[str],
          enabled: cutlass.Constexpr[bool]):
    """With ``enabled`` (a profiled build): the SM clock at the end of ``phase``."""
    if cutlass.const_expr(enabled):
        marks[phase_slot(phases, phase)] = Int64(cute.arch.clock64())


@cute.jit
def begin_marks(marks: cute.Tensor, phases: cutlass.Constexpr, enabled: cutlass.Constexpr[bool]):
    """With ``enabled``: the start stamped, and every phase's end set to it."""
    if cutlass.const_expr(enabled):
        stamp(marks, phases, "start", enabled)
        for phase in cutlass.range_constexpr(1, len(phases) + 1):
            marks[phase] = marks[0]
