"""``moe_route`` for many tokens (prefill-sized batches): a Triton kernel routing a tile of tokens
per program, one warp a program, every step a reduction over the tile's rows at once.

Why: the CuTe kernel (``kernel.py``) spends one CTA of 256 threads and a chain of block syncs on
each token, which is the fastest at decode sizes, but at T = 4096 its 4096 CTAs run in waves of
about a thousand and the chains add up (DeepSeek-V3: 17 us beside FlashInfer's 12.6). Here a
warp holds ``BLOCK_T`` = 2 tokens' scores in registers (16 or 32 a lane) and takes each step
over all of them: the keys, the group scores and the kept groups, then ``topk`` rounds of a row
max, every reduction within the warp (no barrier). Its static SASS (``benchmarks/sass_count.py``)
sets an issue floor at T = 4096 of 5.9 us for DeepSeek-V3, 5.0 ungrouped 256 / 8 and 8.7 for
Kimi-K2's 384 / 8 (the same kernel on 8 warps of 8 tokens: 18.7 us, Triton laying the group
step's warps across experts: 103 barriers). Two tokens a warp, not one: two chains of work
interleave in a warp that would stall on one, and at 83-112 registers the 2048 warps of T = 4096
are resident at once (one token a warp takes two waves of 4096). Routings of more than 8 experts a token or 512
experts stay on the CuTe kernel: their ``topk`` rounds over 1024 padded experts set floors of
22-51 us against its 16-21 measured.

The same order as the reference, bit for bit:

- a key is the 64-bit composite of ``order.composite_key``: the order-preserving bits of the
  canonical fp32 ``score + bias`` (NaN -> -inf, -0.0 -> +0.0) above the complemented expert id,
  so keys are unique and each round's row max is one expert, ties to the lower id;
- a group's score is the fp32 sum of its two best keys (canonical), groups ranked by their own
  composite keys (ties to the lower group);
- the weights are the selected unbiased scores, renormalized by ``reference.warp_sum``'s
  pairwise tree (a sum of two is the same in either order), with the reference's handling of a
  sum that is not > 0, overflowed or infinite, IEEE divisions, then scaled;
- the sigmoid is ``1 / (1 + expf(-x))`` with the accurate ``expf`` and an IEEE division, as the
  CuTe kernel and torch's CUDA sigmoid compute it.

Groups are reshaped in registers, so a grouped routing takes this path where the experts and the
groups are powers of two (DeepSeek-V3's 256 / 8); others stay on the CuTe kernel.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Opt-in (TORCH_SPARSE_DECODE_ROUTE_TILES=1) until it has run on the GPU (tests, fuzzer,
# sanitizer) and its token threshold is measured.
TILES = os.environ.get("TORCH_SPARSE_DECODE_ROUTE_TILES", "0") == "1"
MIN_TOKENS = 512  # fewer stay on the CuTe kernel: a guess to measure (a lone warp is latency-bound, ~6 us)
TOKENS = 2  # a program's tokens (BLOCK_T)
WARPS = 1  # 83-112 registers, no spills (sm_90a); more warps add barriers
MAX_EXPERTS = 512  # routings past these stay on the CuTe kernel (above)
MAX_TOPK = 8
SUM_LANES = tl.constexpr(32)  # reference.warp_sum's width: the selected weights padded with zeros
KEY_NONE = tl.constexpr(-0x7FFFFFFFFFFFFFFF)  # below every live key


if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU interpreter has no libdevice

    @triton.jit
    def _expf(x):
        return tl.exp(x)
else:
    from triton.language.extra.cuda import libdevice

    @triton.jit
    def _expf(x):
        return libdevice.exp(x)  # the accurate expf (tl.exp is the fast ex2-based one)


@triton.jit
def _ordered(x):
    """Canonical fp32 -> int32 whose signed order is the score order (``order.ordered_bits``
    less 2**31)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _unordered(high):
    """The inverse of ``_ordered``: the fp32 score of a key's high half."""
    return tl.where(high < 0, high ^ 0x7FFFFFFF, high).to(tl.float32, bitcast=True)


@triton.jit
def _canonical(x):
    return tl.where(x != x, float("-inf"), x) + 0.0  # + 0.0: -0.0 -> +0.0, the rest unchanged


@triton.jit
def _composite(score, ids):
    """``order.composite_key``: ordered score bits above the complemented id (unique keys)."""
    return (_ordered(score).to(tl.int64) << 32) | (0xFFFFFFFF - ids.to(tl.int64))


@triton.jit
def _kept_groups(keys, BLOCK_T: tl.constexpr, GROUPS: tl.constexpr, SIZE: tl.constexpr,
                 TOPK_GROUP: tl.constexpr):
    """keys with every expert outside the ``TOPK_GROUP`` best groups set to KEY_NONE; a group's
    score is the sum of its two best keys."""
    grouped = tl.reshape(keys, [BLOCK_T, GROUPS, SIZE])
    best = tl.max(grouped, axis=2)
    total = _unordered((best >> 32).to(tl.int32))
    if SIZE > 1:
        second = tl.max(tl.where(grouped == best[:, :, None], KEY_NONE, grouped), axis=2)
        total = _canonical(total + _unordered((second >> 32).to(tl.int32)))
    group_keys = _composite(total, tl.arange(0, GROUPS)[None, :])
    above = tl.sum((group_keys[:, None, :] > group_keys[:, :, None]).to(tl.int32), axis=2)  # the group's rank
    kept = tl.reshape(tl.broadcast_to((above < TOPK_GROUP)[:, :, None], [BLOCK_T, GROUPS, SIZE]),
                      [BLOCK_T, GROUPS * SIZE])
    return tl.where(kept, keys, KEY_NONE)


@triton.jit
def _pair_sums(x, BLOCK_T: tl.constexpr):
    """[BLOCK_T, 32] -> [BLOCK_T, 1]: ``reference.warp_sum``'s tree, adjacent pairs, then pairs of
    pairs (a sum of two is the same in either order)."""
    x = tl.sum(tl.reshape(x, [BLOCK_T, 16, 2]), axis=2)
    x = tl.sum(tl.reshape(x, [BLOCK_T, 8, 2]), axis=2)
    x = tl.sum(tl.reshape(x, [BLOCK_T, 4, 2]), axis=2)
    x = tl.sum(tl.reshape(x, [BLOCK_T, 2, 2]), axis=2)
    return tl.sum(x, axis=1, keep_dims=True)


@triton.jit
def _renormalized(picked, BLOCK_T: tl.constexpr):
    """``reference.renormalized`` on [BLOCK_T, SUM_LANES] weights (zeros past topk)."""
    total = _pair_sums(picked, BLOCK_T)
    infinite = picked == float("inf")
    count = tl.sum(infinite.to(tl.int32), axis=1)[:, None]
    scaled = picked * (1.0 / 256)
    rescaled = _pair_sums(scaled, BLOCK_T)
    plain = tl.where(total > 0, tl.math.div_rn(picked, total), picked)
    overflowed = tl.where(rescaled > 0, tl.math.div_rn(scaled, rescaled), picked)
    share = tl.math.div_rn(tl.full(count.shape, 1.0, tl.float32), tl.maximum(count, 1).to(tl.float32))
    shared = tl.where(infinite, share, 0.0)
    finite = (total == total) & (tl.abs(total) != float("inf"))
    return tl.where(finite, plain, tl.where(count > 0, shared, overflowed))


@triton.jit
def _route_tiles(scores, scores_stride, bias, scale, weights, weights_stride, ids, ids_stride, tokens,
                 EXPERTS: tl.constexpr, EP2: tl.constexpr, TOPK: tl.constexpr, GROUPS: tl.constexpr,
                 TOPK_GROUP: tl.constexpr, SIGMOID: tl.constexpr, RENORMALIZE: tl.constexpr,
                 BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # a programmatic dependent of the router GEMM: wait for its logits
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    expert = tl.arange(0, EP2)
    live = (token < tokens)[:, None] & (expert < EXPERTS)[None, :]
    x = tl.load(scores + token.to(tl.int64)[:, None] * scores_stride + expert[None, :], mask=live, other=0.0)
    score = x.to(tl.float32)  # bf16 / fp16 widen exactly
    if SIGMOID:
        score = tl.math.div_rn(tl.full(score.shape, 1.0, tl.float32), 1.0 + _expf(-score))
    key = score + tl.load(bias + expert, mask=expert < EXPERTS, other=0.0).to(tl.float32)[None, :]
    invalid = (score != score) | (key != key)
    score = tl.where(invalid, 0.0, score)
    key = _canonical(tl.where(invalid, float("-inf"), key))
    keys = tl.where(live, _composite(key, expert[None, :]), KEY_NONE)
    if GROUPS > 1:
        keys = _kept_groups(keys, BLOCK_T, GROUPS, EP2 // GROUPS, TOPK_GROUP)

    slot = tl.arange(0, SUM_LANES)[None, :]
    chosen = tl.zeros([BLOCK_T, SUM_LANES], tl.int32)
    picked = tl.zeros([BLOCK_T, SUM_LANES], tl.float32)
    for i in tl.static_range(TOPK):  # the best key left, each round: keys are unique
        best = tl.max(keys, axis=1)[:, None]
        hit = keys == best
        chosen = tl.where(slot == i, (0xFFFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32), chosen)
        picked = tl.where(slot == i, tl.max(tl.where(hit, score, float("-inf")), axis=1)[:, None], picked)
        keys = tl.where(hit, KEY_NONE, keys)
    if RENORMALIZE:
        picked = _renormalized(picked, BLOCK_T)
    out = (token < tokens)[:, None] & (slot < TOPK)
    rows = token.to(tl.int64)[:, None]
    tl.store(ids + rows * ids_stride + slot, chosen, mask=out)
    tl.store(weights + rows * weights_stride + slot, (picked * scale).to(weights.dtype.element_ty), mask=out)


def fits(experts: int, num_expert_group: int) -> bool:
    """Whether the kernel takes the routing: ungrouped, or power-of-two experts and groups."""
    pow2 = triton.next_power_of_2
    return num_expert_group == 1 or (pow2(experts) == experts and pow2(num_expert_group) == num_expert_group)


def takes(scores: torch.Tensor, num_expert_group: int, topk: int) -> bool:
    """Whether a routing takes this path: a shape test (graph-safe, the same for every token)."""
    tokens, experts = scores.shape
    return (TILES and tokens >= MIN_TOKENS and experts <= MAX_EXPERTS and topk <= MAX_TOPK
            and fits(experts, num_expert_group))


def route_tiles(scores, bias, topk, renormalize, scale, apply_sigmoid, num_expert_group, topk_group, weights,
                ids, pdl: bool = False) -> None:
    """``moe_route`` by the tile kernel (arguments already checked; ``takes`` said yes); ``pdl``:
    launched as a programmatic dependent of the kernel before (``compile.PDL``)."""
    tokens, experts = scores.shape
    ep2 = triton.next_power_of_2(experts)
    block_t = TOKENS
    if tokens:
        _route_tiles[(triton.cdiv(tokens, block_t),)](
            scores, scores.stride(0), bias, scale, weights, weights.stride(0), ids, ids.stride(0), tokens,
            EXPERTS=experts, EP2=ep2, TOPK=topk, GROUPS=num_expert_group, TOPK_GROUP=topk_group,
            SIGMOID=apply_sigmoid, RENORMALIZE=renormalize, BLOCK_T=block_t, PDL=pdl, num_warps=WARPS,
            launch_pdl=pdl,
        )
