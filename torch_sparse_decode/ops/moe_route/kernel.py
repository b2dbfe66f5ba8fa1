"""CUDA kernel of ``moe_route`` (CuTe DSL, SM90; nothing SM90-only, so it runs on SM100 too).

Design: one CTA of 256 threads (8 warps) per token, one launch for the whole routing. (CTAs of
64, 128, 512 and 1024 threads were measured slower at every model: ``benchmarks/RESULTS.md``.)

1. Each thread loads ``ceil(E / 256)`` experts (``e = tid + 256 i``, coalesced; every score and bias
   read issued before the first is used: one round trip), widens bf16 / fp16
   scores to fp32, applies the optional sigmoid, adds the bias and builds a 64-bit key: the
   order-preserving bits of the canonical fp32 key (NaN -> -inf, -0.0 -> +0.0) above the
   complemented expert id. Keys are unique, so the library order (lower id wins ties) is plain
   comparison, and all-equal or all-NaN rows (CUDA-graph padding) behave like any other row.
2. Grouped routing (``num_expert_group`` > 1): the canonical keys go to shared memory; warp w
   reduces groups w, w + 8, ... to their two best keys (a butterfly over the lanes) and their
   fp32 sum; warp 0 ranks the <= 32 group scores (unique 64-bit keys again, ties to the lower
   group) and every expert outside the ``topk_group`` best groups drops below every real key.
   Groups of 32 experts (DeepSeek-V3's; ``GROUP_WARPS``): register i of warp w holds
   group w + 8 i whole, so the warp scores it from registers, and after one barrier (the group
   keys') each warp ranks its own groups: one block barrier instead of three.
3. Threshold: expert ``e`` belongs to lane group ``e % 32``. The ``topk``-th largest of the 32
   lane-group maxima, t0, has at least ``topk`` keys >= it, so every selected key is >= t0. At
   topk > 16 that t0 is loose (at 1024 / 32 it is the least of the 32 maxima: ~120 candidates,
   and ranking them took 5-10 us), so each lane's experts split into two groups there and t0 is
   the topk-th of 64 maxima (~40 candidates). Each maximum is ranked by 8 (or 4) threads at once.
4. Candidates (keys >= t0) are compacted into shared memory with ballots; each candidate's rank
   is the number of candidates above it. Ranks < topk give the output slot directly: ids come out
   in key order with no sort. (Bitonic sorting networks instead, a fixed cost, measured 4.1 us at
   1024 / 32 against 2.7-2.9 us for this.)
5. Warp 0 renormalizes the selected unbiased scores (a butterfly sum over the lanes, the
   reference's order too, so the weights are bit-identical to it) and scales them.

Why not keys of 27 score bits plus the lane (a published Top16 router's layout): ties crowd its
candidate list (every expert of an all-equal row is a candidate, 896 of them); unique
64-bit keys make such rows as cheap as random ones (exactly ``topk`` candidates). Random router
scores give ~20-40 candidates, ranked by up to 32 threads each; an adversarial row can give up
to the whole row, which is still exact, only slower (ranking is quadratic in the candidate count).

The sigmoid is ``1 / (1 + exp(-x))`` with the accurate ``expf`` and an IEEE division, the formula
torch's CUDA sigmoid uses, so ids match ``moe_route(torch.sigmoid(x))`` on the same device.
"""

from __future__ import annotations

import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ...kernels import pdl
from ...kernels.compile import cached_kernel
from ...kernels.cute import warps_before
from ...limits import MOE_MAX_EXPERTS as MAX_EXPERTS
from . import warps
from .build import Routing, compile_route, grouping, routings
from .scoring import KEY_NONE, canonical, expert_key, keyed, read_row, renormalized, unordered

THREADS = 256
WARPS = THREADS // 32


SPLIT_ABOVE_TOPK = 16  # larger topk split each lane's experts into two threshold groups
# On by default (TORCH_SPARSE_DECODE_ROUTE_GROUP_WARPS=0: off): groups of 32 experts scored and ranked
# by the warps that hold them (step 2): DeepSeek-V3 at T = 1 / 64 / 256, 2.92 / 3.06 / 3.34 us against
# 3.02 / 3.14 / 3.40 (H100, PDL, median of two). Read at each launch.
GROUP_WARPS = os.environ.get("TORCH_SPARSE_DECODE_ROUTE_GROUP_WARPS", "1") != "0"


@cute.jit
def best_two(first: Float32, second: Float32):
    """The warp's two best keys from each lane's (first, second): a butterfly, every lane gets them."""
    for b in cutlass.range_constexpr(5):
        other_first = cute.arch.shuffle_sync_bfly(first, offset=1 << b)
        other_second = cute.arch.shuffle_sync_bfly(second, offset=1 << b)
        second = max(max(second, other_second), min(first, other_first))
        first = max(first, other_first)
    return first, second


class MoeRoute(Routing):
    """The CTA kernel at one routing configuration (``build.Routing``)."""

    def __init__(self, *config, group_warps: bool = False):
        super().__init__(*config)
        self.threads, self.warps = THREADS, WARPS
        self.per_thread = -(-self.experts // self.threads)
        # Threshold groups per lane (step 3).
        self.parts = 2 if self.topk > SPLIT_ABOVE_TOPK and self.per_thread >= 2 else 1
        # Step 2 in the warps that hold the groups: only where a group is one warp's register.
        self.group_warps = group_warps and self.groups > 1 and self.group_size == 32

    @cute.jit
    def __call__(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
                 ids: cute.Tensor, stream):
        self.kernel(scores, bias, scale, weights, ids).launch(
            grid=[scores.shape[0], 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=self.pdl
        )

    @cute.jit
    def group_score(self, value: cute.Tensor, group: Int32, lane: Int32) -> Float32:
        """One warp: the fp32 sum of the group's two best keys (its key for groups of one),
        canonical. ``value`` holds every expert's canonical key; a lane's first pass keeps its two
        best, a butterfly merges the lanes' pairs."""
        first = Float32(-Float32.inf)
        second = Float32(-Float32.inf)
        for j in cutlass.range_constexpr(-(-self.group_size // 32)):
            if j * 32 + lane < self.group_size:
                v = value[group * self.group_size + j * 32 + lane]
                second = max(second, min(first, v))
                first = max(first, v)
        first, second = best_two(first, second)
        total = first
        if cutlass.const_expr(self.group_size > 1):
            total = first + second
        return canonical(total)

    @cute.jit
    def keep_best_groups(self, keys: cute.Tensor, value: cute.Tensor, group_key: cute.Tensor, kept: cute.Tensor,
                         tid: Int32):
        """Experts outside the ``topk_group`` best groups drop to KEY_NONE in ``keys``."""
        warp, lane = tid // 32, tid % 32
        for g in cutlass.range_constexpr(-(-self.groups // self.warps)):
            group = g * self.warps + warp
            if group < self.groups:
                score = self.group_score(value, group, lane)
                if lane == 0:
                    group_key[group] = expert_key(score, group)
        cute.arch.sync_threads()
        if warp == 0:
            mine = Int64(KEY_NONE)
            if lane < self.groups:
                mine = group_key[lane]
            above = Int32(0)
            for q in cutlass.range_constexpr(self.groups):
                above += Int32(group_key[q] > mine)
            if lane < self.groups:
                kept[lane] = Int32(above < self.topk_group)
        cute.arch.sync_threads()
        for i in cutlass.range_constexpr(self.per_thread):
            expert = tid + self.threads * i
            if expert < self.experts:
                if kept[expert // self.group_size] == 0:
                    keys[i] = Int64(KEY_NONE)

    @cute.jit
    def keep_groups_in_warps(self, keys: cute.Tensor, group_key: cute.Tensor, tid: Int32):
        """``keep_best_groups`` for groups of 32 experts: register i of warp w holds group
        w + warps * i (expert ``tid + threads * i``), so the warp takes its two best keys by the same
        butterfly from registers; after the group keys' barrier each warp ranks its own groups (the
        same counts, by a ballot). The same sums and comparisons, so the same groups drop."""
        warp, lane = tid // 32, tid % 32
        for i in cutlass.range_constexpr(self.per_thread):
            group = warp + self.warps * i
            if group < self.groups:  # warp-uniform
                # A lane's one key (canonical) and no second: the first pass of ``group_score``.
                first, second = best_two(unordered(Int32(keys[i] >> Int64(32))), Float32(-Float32.inf))
                if lane == 0:
                    group_key[group] = expert_key(canonical(first + second), group)
        cute.arch.sync_threads()
        for i in cutlass.range_constexpr(self.per_thread):
            group = warp + self.warps * i
            if group < self.groups:
                mine = group_key[group]
                other = Int64(KEY_NONE)
                if lane < self.groups:
                    other = group_key[lane]
                above = Int32(cute.arch.popc(cute.arch.vote_ballot_sync(other > mine)))
                if above >= self.topk_group:
                    keys[i] = Int64(KEY_NONE)

    @cute.jit
    def select(self, keys: cute.Tensor, score_of: cute.Tensor, group_max: cute.Tensor, maxima: cute.Tensor,
               threshold: cute.Tensor, warp_count: cute.Tensor, cand_key: cute.Tensor, cand_weight: cute.Tensor,
               picked: cute.Tensor, ids: cute.Tensor, token: Int32, tid: Int32):
        """Steps 3-4: ids in key order by each candidate's rank; their unbiased scores to ``picked``."""
        warp, lane = tid // 32, tid % 32
        if tid == 0:  # t0 where fewer than topk maxima are real (grouped routing): every key
            threshold[0] = Int64(KEY_NONE)
        parts = self.parts
        mine = cute.make_rmem_tensor(parts, Int64)
        for p in cutlass.range_constexpr(parts):
            mine[p] = Int64(KEY_NONE)
        for i in cutlass.range_constexpr(self.per_thread):
            mine[i * parts // self.per_thread] = max(mine[i * parts // self.per_thread], keys[i])
        for p in cutlass.range_constexpr(parts):
            group_max[warp, p * 32 + lane] = mine[p]
        cute.arch.sync_threads()

        # t0: the topk-th largest threshold-group maximum. Real keys are unique, so exactly one
        # maximum is the topk-th; where fewer than topk maxima are real (experts outside the kept
        # groups are KEY_NONE), t0 stays KEY_NONE. ``share`` threads rank each maximum together.
        groups = parts * 32
        share = self.threads // groups
        if tid < groups:
            best = group_max[0, tid]
            for w in cutlass.range_constexpr(1, self.warps):
                best = max(best, group_max[w, tid])
            maxima[tid] = best
        cute.arch.sync_threads()
        mine_max = maxima[tid // share]
        above = Int32(0)
        for q in cutlass.range_constexpr(groups // share):
            above += Int32(maxima[q * share + tid % share] > mine_max)
        for s in cutlass.range_constexpr(share.bit_length() - 1):
            above += cute.arch.shuffle_sync_bfly(above, offset=1 << s)
        if (tid % share == 0) & (above == self.topk - 1) & (mine_max != Int64(KEY_NONE)):
            threshold[0] = mine_max
        cute.arch.sync_threads()

        # Compact the candidates (keys >= t0): ballots within a warp, warp counts across.
        cutoff = threshold[0]
        below_me = (Uint32(1) << Uint32(lane)) - Uint32(1)
        count = Int32(0)
        for i in cutlass.range_constexpr(self.per_thread):
            ballot = cute.arch.vote_ballot_sync(keys[i] >= cutoff)
            count += Int32(cute.arch.popc(ballot))
        if lane == 0:
            warp_count[warp] = count
        cute.arch.sync_threads()
        base, total = warps_before(warp_count, warp, self.warps)
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
            if total * (2 << s) <= self.threads:
                lanes_per = Int32(2 << s)
        per_pass = self.threads // lanes_per
        for first in range(0, total, per_pass):
            j = first + tid // lanes_per
            above = Int32(0)
            key = Int64(KEY_NONE)
            if j < total:
                key = cand_key[j]
                for q in cutlass.range(tid % lanes_per, total, lanes_per, unroll=8):  # independent loads
                    above += Int32(cand_key[q] > key)
            for s in cutlass.range_constexpr(5):
                other = cute.arch.shuffle_sync_bfly(above, offset=1 << s)
                if (1 << s) < lanes_per:
                    above += other
            if (j < total) & (tid % lanes_per == 0) & (above < self.topk):
                ids[token, above] = Int32(Int64(0xFFFFFFFF) - (key & Int64(0xFFFFFFFF)))
                picked[above] = cand_weight[j]

    @cute.kernel
    def kernel(self, scores: cute.Tensor, bias: cute.Tensor, scale: Float32, weights: cute.Tensor,
               ids: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.pdl):
            # The scores are the kernel before's output: wait for it (a no-op after a plain
            # launch). Whatever follows may be scheduled now: it waits for this grid itself.
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        self.route(cutlass.memory.SmemAllocator(), (scores, bias), token, scale, weights, ids, tid)

    @cute.jit
    def load_keys(self, src, token: Int32, keys: cute.Tensor, score_of: cute.Tensor, value: cute.Tensor,
                  tid: Int32):
        """Step 1: this thread's experts' keys and unbiased scores (``value``: every expert's
        canonical key, for grouped routing) from ``src`` = (scores, bias)."""
        scores, bias = src
        raw_score, raw_bias = read_row(scores, bias, token, tid, self.threads, self.per_thread, self.experts)
        for i in cutlass.range_constexpr(self.per_thread):
            # Keyed whether the expert is real or not: a read used only under a branch would be
            # sunk into it, after the previous expert's sigmoid (a round trip each).
            expert = tid + self.threads * i
            score, key = keyed(raw_score[i], raw_bias[i], self.apply_sigmoid)
            real = expert < self.experts
            keys[i] = cutlass.select_(real, expert_key(key, expert), Int64(KEY_NONE))
            score_of[i] = cutlass.select_(real, score, Float32(0.0))
            if cutlass.const_expr(self.groups > 1 and not self.group_warps):
                if real:
                    value[expert] = canonical(key)

    # Shared memory route() allocates at most, with each array's 16-byte padding (kernels that
    # run it after their own arrays, the router front, count it).
    SMEM_BYTES = WARPS * 64 * 8 + 64 * 8 + 8 + WARPS * 4 + MAX_EXPERTS * 12 + 32 * 4 + 32 * 8 + 32 * 4 + 11 * 16

    @cute.jit
    def route(self, smem, src, token: Int32, scale: Float32, weights: cute.Tensor, ids: cute.Tensor, tid: Int32):
        """Steps 1-5 for one token, its keys from ``src`` by ``load_keys``."""
        warp, lane = tid // 32, tid % 32
        group_max = smem.allocate_tensor(Int64, cute.make_layout((self.warps, 64), stride=(64, 1)), 16)
        maxima = smem.allocate_tensor(Int64, cute.make_layout(64), 16)
        threshold = smem.allocate_tensor(Int64, cute.make_layout(1), 16)
        warp_count = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        cand_key = smem.allocate_tensor(Int64, cute.make_layout(MAX_EXPERTS), 16)
        cand_weight = smem.allocate_tensor(Float32, cute.make_layout(MAX_EXPERTS), 16)
        picked = smem.allocate_tensor(Float32, cute.make_layout(32), 16)

        # 1. Keys and unbiased weights of this thread's experts.
        keys = cute.make_rmem_tensor(self.per_thread, Int64)
        score_of = cute.make_rmem_tensor(self.per_thread, Float32)
        value = cand_weight  # grouped routing: every expert's canonical key, until the selection reuses it
        self.load_keys(src, token, keys, score_of, value, tid)

        # 2. Grouped routing: only the experts of the best groups stay.
        if cutlass.const_expr(self.groups > 1):
            group_key = smem.allocate_tensor(Int64, cute.make_layout(32), 16)
            kept = smem.allocate_tensor(Int32, cute.make_layout(32), 16)
            if cutlass.const_expr(self.group_warps):
                self.keep_groups_in_warps(keys, group_key, tid)
            else:
                cute.arch.sync_threads()
                self.keep_best_groups(keys, value, group_key, kept, tid)

        self.select(keys, score_of, group_max, maxima, threshold, warp_count, cand_key, cand_weight, picked, ids,
                    token, tid)
        cute.arch.sync_threads()

        # 5. Weights: renormalize over the selected (a sum that is not > 0 divides by 1), scale, store.
        if warp == 0:
            weight = Float32(0.0)
            if lane < self.topk:
                weight = picked[lane]
            if cutlass.const_expr(self.renormalize):
                weight = renormalized(weight)
            if lane < self.topk:
                weights[token, lane] = (weight * scale).to(weights.element_type)


def catalog(target) -> list[tuple]:
    """The catalog's routings (``build.routings``), with this module's switch as it is set."""
    return [config + (GROUP_WARPS,) for config in routings(target)]


@cached_kernel("moe_route", catalog)
def compiled(experts: int, topk: int, renormalize: bool, apply_sigmoid: bool, groups: int = 1, topk_group: int = 1,
             source: torch.dtype = torch.float32, bias_dtype: torch.dtype = torch.float32,
             weights_dtype: torch.dtype = torch.float32, pdl: bool = False, group_warps: bool = False):
    """The kernel at one static configuration, from fake tensors (no GPU needed)."""
    kernel = MoeRoute(experts, topk, renormalize, apply_sigmoid, groups, topk_group, pdl, group_warps=group_warps)
    return compile_route(kernel, experts, topk, source, bias_dtype, weights_dtype)


def moe_route(scores, bias, topk, renormalize, scale, apply_sigmoid, num_expert_group, topk_group, weights,
              ids) -> None:
    """The CUDA kernel of ``sparse_decode::moe_route`` (arguments already checked)."""
    if scores.shape[0] == 0:
        return
    if warps.takes(scores, num_expert_group, topk):  # prefill-sized batches: one warp a token
        warps.route(scores, bias, topk, renormalize, scale, apply_sigmoid, num_expert_group, topk_group, weights, ids,
                    pdl.enabled(pdl.ROUTE))
        return
    groups, kept = grouping(num_expert_group, topk_group)
    compiled(scores.shape[1], topk, renormalize, apply_sigmoid, groups, kept, scores.dtype, bias.dtype,
             weights.dtype, pdl.enabled(pdl.ROUTE), GROUP_WARPS)(scores, bias, scale, weights, ids)
