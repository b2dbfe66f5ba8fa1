"""Keys: each score as a 32-bit unsigned word whose order is the library order (NaN as -inf,
-0.0 as +0.0; 0 is below every score: no key), and the three radix digits the search reads."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, bits) of the three radix digits, top first


@cute.jit
def ordered_key(x: Float32) -> Uint32:
    """Unsigned key of an fp32 score in the library order; 0 is below every score (no key).

    Four instructions (this runs on every key of every pass): ``max.f32`` returns its non-NaN
    operand (NaN ranks as -inf), ``-0.0 + 0.0`` is ``+0.0`` in round-to-nearest, neither flushes
    subnormals (no .ftz); then negative scores flip all bits, the rest only the sign."""
    return cute.arch.inline_ptx(
        "{ .reg .f32 f; .reg .b32 s; max.f32 f, {$r0}, 0fFF800000; add.rn.f32 f, f, 0f00000000; "
        "mov.b32 {$w0}, f; shr.s32 s, {$w0}, 31; or.b32 s, s, 0x80000000; xor.b32 {$w0}, {$w0}, s; }",
        write_only_types=[Uint32], read_only_args=[x],
    )


@cute.jit
def key_score(key: Uint32) -> Float32:
    """The fp32 score whose ``ordered_key`` is ``key``: exact for every key but those of -inf and
    +0.0, which NaN and -0.0 share (``KEY_NEG_INF``, ``KEY_ZERO``)."""
    flip = cutlass.select_((key >> Uint32(31)) != Uint32(0), Uint32(0x80000000), Uint32(0xFFFFFFFF))
    return (key ^ flip).bitcast(Float32)


KEY_NEG_INF = 0x007FFFFF  # ordered_key(-inf) = ordered_key(NaN)
KEY_ZERO = 0x80000000  # ordered_key(+0.0) = ordered_key(-0.0)


@cute.jit
def ord16_key(x: Float32) -> Uint32:
    """The DCP merge's key of a score: ord16 of it rounded to bf16 (nearest even, on the bits),
    NaN as -inf, -0.0 as +0.0, shifted up 16 (never 0). Equal bf16 values tie (lower id first)."""
    bits = x.bitcast(Uint32)
    b = (bits + Uint32(0x7FFF) + ((bits >> Uint32(16)) & Uint32(1))) >> Uint32(16)
    b = cutlass.select_(x != x, Uint32(0xFF80), b)  # NaN ranks as -inf
    b = cutlass.select_(b == Uint32(0x8000), Uint32(0), b)  # -0.0 ties +0.0
    ord16 = cutlass.select_(b >= Uint32(0x8000), Uint32(0xFFFF) - b, b | Uint32(0x8000))
    return Uint32(ord16 << Uint32(16))


@cute.jit
def source_key(x, source: cutlass.Constexpr, ord16: cutlass.Constexpr[bool]) -> Uint32:
    """The key of an element of a ``source`` row: block keys are already ordered; float scores
    by their full bits, or (``ord16``, the DCP pack) by their bf16 ord16; bf16 / fp16 widen exactly."""
    if cutlass.const_expr(source is Int32):
        key = x.bitcast(Uint32)
    elif cutlass.const_expr(ord16):
        key = ord16_key(x.to(Float32))
    elif cutlass.const_expr(source is not Float32):
        key = ordered_key(x.to(Float32))
    else:
        key = ordered_key(x)
    return key


@cute.jit
def digit_of(key: Uint32, p: cutlass.Constexpr[int]) -> Int32:
    shift, bits = DIGITS[p]
    return Int32((key >> Uint32(shift)) & Uint32((1 << bits) - 1))


@cute.jit
def digit_shift(p: Int32) -> Int32:
    """DIGITS[p]'s shift for a digit index that is not a constant."""
    first, second, third = (Int32(shift) for shift, _ in DIGITS)
    return cutlass.select_(p == 0, first, cutlass.select_(p == 1, second, third))


@cute.jit
def in_prefix(key: Uint32, t: Uint32, p: cutlass.Constexpr[int]):
    """Whether a live key's digits above digit p equal t's."""
    shift, bits = DIGITS[p]
    live = key != Uint32(0)
    if cutlass.const_expr(p > 0):
        live = live & ((key >> Uint32(shift + bits)) == (t >> Uint32(shift + bits)))
    return live
