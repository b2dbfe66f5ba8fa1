"""CuTe DSL device helpers shared by the kernels (inlined where they are called)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32


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
