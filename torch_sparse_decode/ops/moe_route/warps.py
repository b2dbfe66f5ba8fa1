"""``moe_route`` with one warp per token (CuTe DSL, SM90): no shared memory and no block barrier.

Why: the CTA kernel (``kernel.py``) gives each token 256 threads and a chain of block syncs
(threshold, compaction, ranking). At T = 4096 its 4096 CTAs queue in waves and the chains add up
(DeepSeek-V3: 16.9 us beside FlashInfer's 12.6, H100). Here a token's experts fit one warp's
registers (E <= 512: 16 a lane) and every step is a warp reduction (``redux.sync``), so 4096
tokens are 4096 independent warps, resident at once: 10.5 us. A warp alone is slower, though: its
instructions a token run as one dependent chain, so the op sends only batches of ``MIN_TOKENS`` or
more here (the measured crossover). A Triton
kernel of two tokens a warp measured slower than both (22.5 us at T = 4096) and was removed.

Expert ``e`` lives in lane ``e % 32``, register ``e // 32``; its key is ``ordered(score + bias)``
(the fp32 order as a signed int32, NaN as -inf, -0.0 as +0.0), its weight score beside it.

1. Groups (``num_expert_group`` > 1, groups of a multiple of 32 experts): group ``g`` is registers
   ``g * c .. g * c + c - 1`` of every lane (c = group size / 32). Its two best keys: the warp max
   of the lanes' bests, the lowest lane holding it, then the warp max of every lane's best with
   that lane's second in its place. Their fp32 sum (canonical) is the group score; lane g ranks
   group g (ties to the lower group), and a ballot of the ``topk_group`` best drops every other
   group's experts to ``NONE``.
2. ``topk`` rounds: each lane's best (its lowest register on ties: the lower expert id), the warp
   max of those, and of the lanes holding it the lowest expert id (``redux.sync.min``): the
   reference's order, ties to the lower id. The winner drops to ``NONE``; lane ``r`` keeps round
   ``r``'s id, then fetches its weight score from the lane holding it.
3. Lanes < ``topk`` renormalize over the warp (``scoring.renormalized``, the reference's order of
   additions), scale and store: ids in key order, no sort.

Routings of more than 512 experts or 8 a token, and groups not a multiple of 32 experts, stay on
the CTA kernel.
"""

from __future__ import annotations

import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...kernels.compile import Target, cached_kernel
from ...kernels.cute import warp_max, warp_min
from .build import Routing, compile_route, grouping, routings
from .scoring import canonical, keyed, ordered, read_row, renormalized, unordered

# On by default; TORCH_SPARSE_DECODE_ROUTE_WARPS=0 keeps every batch on the CTA kernel.
ON = os.environ.get("TORCH_SPARSE_DECODE_ROUTE_WARPS", "1") == "1"
# The fewest tokens routed here, grouped or not (one crossover for both): where this kernel
# overtakes the CTA kernel (H100, PDL, fp32 logits, both reading a thread's row at once;
# benchmarks/RESULTS.md): between 256 and
# 512 tokens for DeepSeek-V3 (3.35 / 3.37 us against 3.14 / 3.94), Kimi-K2 (3.29 / 3.39 against
# 2.90 / 3.52) and 256 / 8 ungrouped (2.90 / 2.92 against 2.76 / 3.19).
MIN_TOKENS = 512
MAX_EXPERTS = 512  # 16 keys and 16 scores a lane
MAX_TOPK = 8
TOKENS = 4  # warps (tokens) a CTA
NONE = -(1 << 31)  # below every real key's ordered bits (-inf's are above it)


def lane_best(pairs: list) -> tuple:
    """(key, register) of a lane's best key, the lower register on ties: a tree of pairs (depth
    log2 of the registers, not a chain of them), traced in Python at compile time."""
    while len(pairs) > 1:
        merged = []
        for (key, at), (other, other_at) in zip(pairs[0::2], pairs[1::2]):
            better = other > key  # the right one holds the higher registers: it wins only when greater
            merged.append((cutlass.select_(better, other, key), cutlass.select_(better, other_at, at)))
        pairs = merged + pairs[len(merged) * 2:]
    return pairs[0]


class WarpRoute(Routing):
    """The warp kernel at one routing configuration (``build.Routing``)."""

    def __init__(self, *config):
        super().__init__(*config)
        self.per_lane = -(-self.experts // 32)
        self.chunk = self.group_size // 32 if self.groups > 1 else 0  # registers a group spans

    @cute.jit
    def __call__(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
                 ids: cute.Tensor, stream):
        tokens = scores.shape[0]
        self.kernel(scores, bias, scale, weights, ids).launch(
            grid=[(tokens + TOKENS - 1) // TOKENS, 1, 1], block=[32 * TOKENS, 1, 1], stream=stream,
            use_pdl=self.pdl
        )

    @cute.jit
    def keep_best_groups(self, high: cute.Tensor, lane: Int32):
        """Step 1: experts outside the ``topk_group`` best groups drop to ``NONE``."""
        group_high = cute.make_rmem_tensor(self.groups, Int32)
        for g in cutlass.range_constexpr(self.groups):
            first = Int32(NONE)
            second = Int32(NONE)
            for j in cutlass.range_constexpr(self.chunk):
                v = high[g * self.chunk + j]
                second = max(second, min(first, v))
                first = max(first, v)
            top = warp_max(first)
            owner = warp_min(cutlass.select_(first == top, lane, Int32(32)))
            runner = warp_max(cutlass.select_(lane == owner, second, first))
            group_high[g] = ordered(canonical(unordered(top) + unordered(runner)))
        # Lane g ranks group g (ties to the lower group); a ballot tells every lane the kept groups.
        mine = group_high[0]
        for g in cutlass.range_constexpr(1, self.groups):
            mine = cutlass.select_(lane == g, group_high[g], mine)
        above = Int32(0)
        for q in cutlass.range_constexpr(self.groups):
            above += Int32(group_high[q] > mine) + Int32((group_high[q] == mine) & (lane > q))
        kept = cute.arch.vote_ballot_sync((lane < self.groups) & (above < self.topk_group))
        for g in cutlass.range_constexpr(self.groups):
            for j in cutlass.range_constexpr(self.chunk):
                high[g * self.chunk + j] = cutlass.select_((kept >> g) & 1 == 0, Int32(NONE), high[g * self.chunk + j])

    @cute.kernel
    def kernel(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
               ids: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        lane = tid % 32
        token = block * TOKENS + tid // 32
        if cutlass.const_expr(self.pdl):
            # The scores are the kernel before's output: wait for it (a no-op after a plain
            # launch). Whatever follows may be scheduled now: it waits for this grid itself.
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        tokens = scores.shape[0]
        row = min(token, tokens - 1)  # a last CTA's idle warps route the last token again, unstored:
        # no branch around the warp reductions, so every one runs converged
        high = cute.make_rmem_tensor(self.per_lane, Int32)
        score_of = cute.make_rmem_tensor(self.per_lane, Float32)
        raw_score, raw_bias = read_row(scores, bias, row, lane, 32, self.per_lane, self.experts)
        for i in cutlass.range_constexpr(self.per_lane):
            # Keyed whether real or not, so no read is sunk under a branch (``read_row``).
            real = lane + 32 * i < self.experts
            score, key = keyed(raw_score[i], raw_bias[i], self.apply_sigmoid)
            high[i] = cutlass.select_(real, ordered(key), Int32(NONE))
            score_of[i] = cutlass.select_(real, score, Float32(0.0))
        if cutlass.const_expr(self.groups > 1):
            self.keep_best_groups(high, lane)

        # 2. topk rounds; lane r keeps round r's expert.
        chosen = Int32(0)
        for r in cutlass.range_constexpr(self.topk):
            best, at = lane_best([(high[i], Int32(i)) for i in range(self.per_lane)])
            top = warp_max(best)
            winner = warp_min(cutlass.select_(best == top, lane + 32 * at, Int32(1 << 30)))
            for i in cutlass.range_constexpr(self.per_lane):
                high[i] = cutlass.select_(lane + 32 * i == winner, Int32(NONE), high[i])
            chosen = cutlass.select_(lane == r, winner, chosen)
        # Its weight score, from the lane that holds it.
        picked = Float32(0.0)
        for i in cutlass.range_constexpr(self.per_lane):
            held = cute.arch.shuffle_sync(score_of[i], chosen % 32)
            picked = cutlass.select_((lane < self.topk) & (chosen // 32 == i), held, picked)

        # 3. Weights over the warp (lanes past topk hold 0), scaled; ids in key order.
        if cutlass.const_expr(self.renormalize):
            picked = renormalized(picked)
        if (lane < self.topk) & (token < tokens):
            ids[token, lane] = chosen
            weights[token, lane] = (picked * scale).to(weights.element_type)


def fits(experts: int, groups: int, topk: int) -> bool:
    """Whether this kernel can route this shape at all (the module's limits)."""
    return experts <= MAX_EXPERTS and topk <= MAX_TOPK and (groups <= 1 or (experts // groups) % 32 == 0)


def takes(scores: torch.Tensor, num_expert_group: int, topk: int) -> bool:
    """Whether the op routes ``scores`` here: switched on, enough tokens, a shape that fits. Both
    kernels give the reference's bits, so a token's result never depends on its batch."""
    return (ON and scores.shape[0] >= MIN_TOKENS
            and fits(scores.shape[1], num_expert_group, topk))


def route(scores, bias, topk, renormalize, scale, apply_sigmoid, num_expert_group, topk_group, weights, ids,
          pdl_on: bool = False) -> None:
    """``moe_route`` by this kernel (arguments checked, a shape that ``fits``)."""
    groups, kept = grouping(num_expert_group, topk_group)
    compiled(scores.shape[1], topk, renormalize, apply_sigmoid, groups, kept, scores.dtype, bias.dtype,
             weights.dtype, pdl_on)(scores, bias, scale, weights, ids)


def catalog(target: Target) -> list[tuple]:
    """Where switched on, the catalog's routings (``build.routings``) this kernel takes."""
    return [c for c in routings(target) if fits(c[0], c[4], c[1])] if ON else []


@cached_kernel("moe_route_warps", catalog)
def compiled(experts: int, topk: int, renormalize: bool, apply_sigmoid: bool, groups: int, topk_group: int,
             source: torch.dtype, bias_dtype: torch.dtype, weights_dtype: torch.dtype, pdl: bool):
    """The kernel at one configuration (``kernel.compiled``'s, every argument given), from fake tensors."""
    kernel = WarpRoute(experts, topk, renormalize, apply_sigmoid, groups, topk_group, pdl)
    return compile_route(kernel, experts, topk, source, bias_dtype, weights_dtype)
