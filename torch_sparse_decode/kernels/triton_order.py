"""Triton twins of ``order.py``'s keys, shared by the Triton kernels that rank by them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ord16(x):
    """The ord16 of scores rounded to bf16 (nearest even), NaN as -inf, -0.0 as +0.0: 16 bits whose
    unsigned order is the rounded scores' order (``order.bf16_ord16``).

    Integer arithmetic on the bits only: the same result compiled and in the CPU interpreter."""
    if x.dtype == tl.bfloat16:
        b = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = tl.where((b & 0x7FFF) > 0x7F80, 0xFF80, b)  # NaN -> -inf
    else:
        bits = x.to(tl.int32, bitcast=True)
        b = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
        b = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0xFF80, b)  # NaN -> -inf
    b = tl.where(b == 0x8000, 0, b)  # -0.0 -> +0.0
    return tl.where(b >= 0x8000, 0xFFFF - b, b | 0x8000)
