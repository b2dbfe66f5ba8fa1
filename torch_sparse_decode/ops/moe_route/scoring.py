"""Device math that every routing kernel shares (the CTA kernel, the warp kernel, the router
front), so their keys, sigmoid and weights are one definition and bit-identical to each other and
to the reference: the 64-bit library-order key, the canonical fp32 key, torch's CUDA sigmoid, and
the renormalization of the selected weights over a warp."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

KEY_NONE = -(1 << 63)  # below every real key


@cute.jit
def ordered(key: Float32) -> Int32:
    """The fp32 bits of a key (NaN already mapped to -inf) as a signed int of the same order, the
    negative range flipped; -0.0 ties +0.0. Every real key's is above ``-2**31``."""
    bits = key.bitcast(Int32)
    if bits == Int32(-(1 << 31)):  # -0.0 ties +0.0
        bits = Int32(0)
    return bits ^ ((bits >> 31) & Int32(0x7FFFFFFF))


@cute.jit
def unordered(high: Int32) -> Float32:
    """The fp32 key of ``ordered`` bits (the flip is its own inverse; -0.0 comes back as +0.0)."""
    return (high ^ ((high >> 31) & Int32(0x7FFFFFFF))).bitcast(Float32)


@cute.jit
def expert_key(key: Float32, expert: Int32) -> Int64:
    """Signed 64-bit library-order key of an fp32 key (NaN already mapped to -inf) and its id
    (an expert's, or a group's).

    High half: ``ordered(key)``; low half: ``0xFFFFFFFF - expert``, so equal scores rank the lower
    id first. Signed keys keep every comparison and max in one signedness.
    """
    return (Int64(ordered(key)) << 32) | (Int64(0xFFFFFFFF) - Int64(expert))


@cute.jit
def sigmoid(x: Float32) -> Float32:
    """``1 / (1 + exp(-x))`` with the accurate ``expf`` and an IEEE division: torch's CUDA formula."""
    return Float32(1.0) / (Float32(1.0) + cute.math.exp(-x, fastmath=False))


@cute.jit
def scored(score: Float32, bias: Float32):
    """(weight score, ranking key) of one expert's score (after any sigmoid): the key is ``score +
    bias``; a NaN score or key gives (0, -inf)."""
    key = score + bias
    if (score != score) | (key != key):
        score = Float32(0.0)
        key = -Float32.inf
    return score, key


@cute.jit
def read_row(scores: cute.Tensor, bias: cute.Tensor, token: Int32, first: Int32, stride: cutlass.Constexpr[int],
             count: cutlass.Constexpr[int], experts: cutlass.Constexpr[int]):
    """(scores, biases) of experts ``first + stride * i``, i < ``count``, of one token, as stored:
    every read issued before any value is used, so a thread waits one round trip, not two per
    expert (a read after a sigmoid waits for it). Experts past the row read its last one: no
    branch between the reads. The caller keys every value read and selects the real ones, so
    the compiler cannot sink a read under a branch after the sigmoid before it."""
    raw_score = cute.make_rmem_tensor(count, scores.element_type)
    raw_bias = cute.make_rmem_tensor(count, bias.element_type)
    for i in cutlass.range_constexpr(count):
        expert = min(first + stride * i, experts - 1)
        raw_score[i] = scores[token, expert]
        raw_bias[i] = bias[expert]
    return raw_score, raw_bias


@cute.jit
def keyed(score, bias, apply_sigmoid: cutlass.Constexpr[bool]):
    """(weight score, ranking key) of one expert from its score and bias as ``read_row`` read them."""
    score = score.to(Float32)
    if cutlass.const_expr(apply_sigmoid):
        score = sigmoid(score)
    return scored(score, bias.to(Float32))


@cute.jit
def warp_sum(value):
    """``value`` summed over the warp (butterfly: every lane gets the sum)."""
    for s in cutlass.range_constexpr(5):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=1 << s)
    return value


@cute.jit
def canonical(x: Float32) -> Float32:
    """NaN as -inf, -0.0 as +0.0 (adding +0.0 turns -0.0 into +0.0 and keeps everything else)."""
    return cutlass.select_(x != x, -Float32.inf, x) + Float32(0.0)


@cute.jit
def renormalized(weight: Float32) -> Float32:
    """A lane's selected weight divided by the warp's sum (lanes past topk hold 0); a sum that is
    not > 0 divides by 1. Only a sum that is inf or NaN takes more steps: +inf weights share the
    weight evenly and the others get 0; else the finite weights overflowed it (or one is -inf),
    and the sum is taken again on the weights scaled by 2**-8, exact for weights that large, so no
    finite input overflows it. Every branch is warp-uniform. The reference does these same fp32
    operations in the same order (the butterfly's pairs), so the weights are bit-identical."""
    total = warp_sum(weight)
    result = weight
    if (total - total) != Float32(0.0):
        infinite = warp_sum(Int32(weight == Float32.inf))
        if infinite > 0:
            result = cutlass.select_(weight == Float32.inf, Float32(1.0) / Float32(infinite), Float32(0.0))
        else:
            scaled = weight * Float32(1.0 / 256)
            total = warp_sum(scaled)
            if total > Float32(0.0):
                result = scaled / total
    elif total > Float32(0.0):
        result = weight / total
    return result
