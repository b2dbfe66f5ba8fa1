"""CUDA kernel of ``moe_route`` (CuTe DSL, SM90; nothing SM90-only, so it runs on SM100 too).

Design: one CTA of 256 threads (8 warps) per token, one launch for the whole routing.

1. Each thread loads ``ceil(E / 256)`` experts (``e = tid + 256 i``, coalesced), applies the
   optional sigmoid, adds the bias and builds a 64-bit key: the order-preserving bits of the
   canonical fp32 key (NaN -> -inf, -0.0 -> +0.0) above the complemented expert id. Keys are
   unique, so the library order (lower id wins ties) is plain unsigned comparison, and all-equal
   or all-NaN rows (CUDA-graph padding) behave like any other row.
2. Threshold: expert ``e`` belongs to group ``e % 32`` (its lane). The ``topk``-th largest of the
   32 group maxima, t0, has at least ``topk`` keys >= it, so every selected key is >= t0.
3. Candidates (keys >= t0) are compacted into shared memory with ballots; each candidate's rank
   is the number of candidates above it. Ranks < topk give the output slot directly: ids come out
   in key order with no sort.
4. Warp 0 renormalizes the selected unbiased scores and scales them.

Why not the seed's exact layout: the seed keys groups on 27 score bits plus the lane, so ties
crowd its candidate list (every expert of an all-equal row is a candidate, 896 of them); unique
64-bit keys make such rows as cheap as random ones (exactly ``topk`` candidates). Random router
scores give ~20-40 candidates, ranked by up to 32 threads each; an adversarial row can give up
to 16 * 28, which is still exact, only slower (ranking is quadratic in the candidate count).

The sigmoid is ``1 / (1 + exp(-x))`` with the accurate ``expf`` and an IEEE division, the formula
torch's CUDA sigmoid uses, so ids match ``moe_route(torch.sigmoid(x))`` on the same device.
"""

from __future__ import annotations


import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ...kernels.compile import cached_kernel, fake_stream, fake_tensor
from ...kernels.cute import warps_before
from ...limits import MOE_MAX_EXPERTS as MAX_EXPERTS

THREADS = 256
WARPS = THREADS // 32


KEY_NONE = -(1 << 63)  # below every real key


@cute.jit
def ordered_key(key: Float32, expert: Int32) -> Int64:
    """Signed 64-bit library-order key of an fp32 key (NaN already mapped to -inf).

    High half: the fp32 bits as a signed int with the negative range flipped (order-preserving);
    low half: ``0xFFFFFFFF - expert``, so equal scores rank the lower id first. Signed keys keep
    every comparison and max in one signedness.
    """
    bits = key.bitcast(Int32)
    if bits == Int32(-(1 << 31)):  # -0.0 ties +0.0
        bits = Int32(0)
    flipped = bits ^ ((bits >> 31) & Int32(0x7FFFFFFF))
    return (Int64(flipped) << 32) | (Int64(0xFFFFFFFF) - Int64(expert))


@cute.jit
def warp_sum(value):
    """``value`` summed over the warp (butterfly: every lane gets the sum)."""
    for s in cutlass.range_constexpr(5):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=1 << s)
    return value


@cute.jit
def renormalized(weight: Float32) -> Float32:
    """A lane's selected weight divided by the warp's sum (lanes past topk hold 0); a sum that is
    not > 0 divides by 1. Only a sum that is inf or NaN takes more steps: +inf weights share the
    weight evenly and the others get 0; else the finite weights overflowed it (or one is -inf),
    and the sum is taken again on the weights scaled by 2**-8, exact for weights that large, so no
    finite input overflows it. Every branch is warp-uniform."""
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


class MoeRoute:
    """Routing for one static configuration (E, topk, renormalize, apply_sigmoid)."""

    def __init__(self, experts: int, topk: int, renormalize: bool, apply_sigmoid: bool):
        self.experts, self.topk = experts, topk
        self.renormalize, self.apply_sigmoid = renormalize, apply_sigmoid
        self.per_thread = -(-experts // THREADS)

    @cute.jit
    def __call__(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
                 ids: cute.Tensor, stream):
        self.kernel(scores, bias, scale, weights, ids).launch(
            grid=[scores.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
               ids: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32

        smem = cutlass.memory.SmemAllocator()
        group_max = smem.allocate_tensor(Int64, cute.make_layout((WARPS, 32), stride=(32, 1)), 16)
        maxima = smem.allocate_tensor(Int64, cute.make_layout(32), 16)
        threshold = smem.allocate_tensor(Int64, cute.make_layout(1), 16)
        warp_count = smem.allocate_tensor(Int32, cute.make_layout(WARPS), 16)
        cand_key = smem.allocate_tensor(Int64, cute.make_layout(MAX_EXPERTS), 16)
        cand_weight = smem.allocate_tensor(Float32, cute.make_layout(MAX_EXPERTS), 16)
        picked = smem.allocate_tensor(Float32, cute.make_layout(32), 16)

        # 1. Keys and unbiased weights of this thread's experts.
        keys = cute.make_rmem_tensor(self.per_thread, Int64)
        score_of = cute.make_rmem_tensor(self.per_thread, Float32)
        mine = Int64(KEY_NONE)
        for i in cutlass.range_constexpr(self.per_thread):
            expert = tid + THREADS * i
            keys[i] = Int64(KEY_NONE)
            score_of[i] = Float32(0.0)
            if expert < self.experts:
                score = scores[token, expert]
                if cutlass.const_expr(self.apply_sigmoid):
                    score = Float32(1.0) / (Float32(1.0) + cute.math.exp(-score, fastmath=False))
                key = score + bias[expert]
                if (score != score) | (key != key):
                    score = Float32(0.0)
                    key = -Float32.inf
                keys[i] = ordered_key(key, expert)
                score_of[i] = score
            mine = max(mine, keys[i])
        group_max[warp, lane] = mine
        cute.arch.sync_threads()

        # 2. t0: the topk-th largest group maximum (keys are unique, so ranks are too).
        if warp == 0:
            best = group_max[0, lane]
            for w in cutlass.range_constexpr(1, WARPS):
                best = max(best, group_max[w, lane])
            maxima[lane] = best
            cute.arch.sync_warp()
            above = Int32(0)
            for q in cutlass.range_constexpr(32):
                above += Int32(maxima[q] > best)
            if above == self.topk - 1:
                threshold[0] = best
        cute.arch.sync_threads()

        # 3. Compact the candidates (keys >= t0): ballots within a warp, warp counts across.
        cutoff = threshold[0]
        below_me = (Uint32(1) << Uint32(lane)) - Uint32(1)
        count = Int32(0)
        for i in cutlass.range_constexpr(self.per_thread):
            ballot = cute.arch.vote_ballot_sync(keys[i] >= cutoff)
            count += Int32(cute.arch.popc(ballot))
        if lane == 0:
            warp_count[warp] = count
        cute.arch.sync_threads()
        base, total = warps_before(warp_count, warp, WARPS)
        for i in cutlass.range_constexpr(self.per_thread):
            candidate = keys[i] >= cutoff
            ballot = cute.arch.vote_ballot_sync(candidate)
            if candidate:
                slot = base + Int32(cute.arch.popc(ballot & below_me))
                cand_key[slot] = keys[i]
                cand_weight[slot] = score_of[i]
            base += Int32(cute.arch.popc(ballot))
        cute.arch.sync_threads()

        # Each candidate's rank (candidates above it) is its output slot. P threads share a
        # candidate, each counting over every P-th candidate, so short lists finish in a few steps.
        lanes_per = Int32(1)
        for s in cutlass.range_constexpr(5):
            if total * (2 << s) <= THREADS:
                lanes_per = Int32(2 << s)
        per_pass = THREADS // lanes_per
        for first in range(0, total, per_pass):
            j = first + tid // lanes_per
            above = Int32(0)
            key = Int64(KEY_NONE)
            if j < total:
                key = cand_key[j]
                for q in range(tid % lanes_per, total, lanes_per):
                    above += Int32(cand_key[q] > key)
            for s in cutlass.range_constexpr(5):
                other = cute.arch.shuffle_sync_bfly(above, offset=1 << s)
                if (1 << s) < lanes_per:
                    above += other
            if (j < total) & (tid % lanes_per == 0) & (above < self.topk):
                ids[token, above] = Int32(Int64(0xFFFFFFFF) - (key & Int64(0xFFFFFFFF)))
                picked[above] = cand_weight[j]
        cute.arch.sync_threads()

        # 4. Weights: renormalize over the selected (a sum that is not > 0 divides by 1), scale.
        if warp == 0:
            weight = Float32(0.0)
            if lane < self.topk:
                weight = picked[lane]
            if cutlass.const_expr(self.renormalize):
                weight = renormalized(weight)
            if lane < self.topk:
                weights[token, lane] = weight * scale


@cached_kernel("moe_route")
def compiled(experts: int, topk: int, renormalize: bool, apply_sigmoid: bool):
    """The kernel at one static configuration, from fake tensors (no GPU needed)."""
    tokens = cute.sym_int()
    scores = fake_tensor(Float32, (tokens, experts), (experts, 1))
    bias = fake_tensor(Float32, (experts,), (1,))
    weights = fake_tensor(Float32, (tokens, topk), (topk, 1))
    ids = fake_tensor(Int32, (tokens, topk), (topk, 1))
    kernel = MoeRoute(experts, topk, renormalize, apply_sigmoid)
    return cute.compile(kernel, scores, bias, Float32(1.0), weights, ids, fake_stream(), options="--enable-tvm-ffi")


def moe_route(scores, bias, topk, renormalize, scale, apply_sigmoid, weights, ids) -> None:
    """The CUDA kernel of ``sparse_decode::moe_route`` (arguments already checked)."""
    if scores.shape[0] == 0:
        return
    compiled(scores.shape[1], topk, renormalize, apply_sigmoid)(scores, bias, scale, weights, ids)


# Configurations compiled by warmup(): the DeepSeek-V3, Kimi-K2 and seed shapes.
WARM_CONFIGS = [(e, k, r, False) for e, k in ((896, 16), (384, 8), (256, 8)) for r in (True, False)]


def warm(device: torch.device) -> None:
    for experts, topk, renormalize, apply_sigmoid in WARM_CONFIGS:
        compiled(experts, topk, renormalize, apply_sigmoid)
