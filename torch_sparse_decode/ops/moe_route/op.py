"""``sparse_decode::moe_route``: its argument check, its registration and its Python wrapper."""

from __future__ import annotations

import math

import torch

from ..._library import (
    check_int,
    check_is_tensor,
    check_no_overlap,
    check_same_device,
    check_scalar,
    check_shape,
    check_tensor,
    define_op,
)
from ...dtypes import ROUTER_SCORES
from ...limits import MOE_MAX_EXPERTS, MOE_MAX_GROUPS, MOE_MAX_TOPK
from . import reference



def check_moe_route(scores, bias, topk, renormalize, scale, apply_sigmoid, num_expert_group, topk_group,
                    weights, ids) -> None:
    check_tensor(scores, "scores", dtypes=ROUTER_SCORES, ndim=2)
    tokens, experts = scores.shape
    if not 1 <= experts <= MOE_MAX_EXPERTS:
        raise ValueError(f"scores must have 1 to {MOE_MAX_EXPERTS} experts (columns), got {experts}")
    same = (torch.float32,) if scores.dtype == torch.float32 else (torch.float32, scores.dtype)
    check_tensor(bias, "bias", dtypes=same, ndim=1)
    check_shape(bias, "bias", (experts,))
    check_int(num_expert_group, "num_expert_group", 1, min(MOE_MAX_GROUPS, experts))
    if experts % num_expert_group:
        raise ValueError(f"num_expert_group ({num_expert_group}) must divide the {experts} experts")
    check_int(topk_group, "topk_group", 1, num_expert_group)
    check_int(topk, "topk", 1, min(MOE_MAX_TOPK, experts))
    kept = topk_group * (experts // num_expert_group)
    if topk > kept:
        raise ValueError(f"topk must be <= topk_group * experts / num_expert_group = {kept} (the experts of the "
                         f"kept groups), got {topk}")
    check_scalar(renormalize, "renormalize", bool)
    check_scalar(apply_sigmoid, "apply_sigmoid", bool)
    check_scalar(scale, "scale", float)
    if isinstance(scale, (int, float)) and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    check_tensor(weights, "weights", dtypes=same, ndim=2)
    check_shape(weights, "weights", (tokens, topk))
    check_tensor(ids, "ids", dtypes=(torch.int32,), ndim=2)
    check_shape(ids, "ids", (tokens, topk))
    check_same_device(scores, "scores", bias=bias, weights=weights, ids=ids)
    check_no_overlap({"weights": weights, "ids": ids}, {"scores": scores, "bias": bias})


def check_route_args(topk, renormalize, scale, num_expert_group, topk_group) -> tuple[int, int, int]:
    """A routing wrapper's scalars, checked before the call (the dispatcher would reject a wrong
    type with a RuntimeError): (topk, num_expert_group, topk_group) as Python ints."""
    topk = check_int(topk, "topk", 1, MOE_MAX_TOPK)
    num_expert_group = check_int(num_expert_group, "num_expert_group", 1, MOE_MAX_GROUPS)
    topk_group = check_int(topk_group, "topk_group", 1, num_expert_group)
    check_scalar(renormalize, "renormalize", bool)
    check_scalar(scale, "scale", float)
    return topk, num_expert_group, topk_group



define_op("moe_route", ("weights", "ids"), check_moe_route, cuda=f"{__package__}.kernel")(reference.moe_route)


def moe_route(
    scores: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    *,
    renormalize: bool = True,
    scale: float = 1.0,
    apply_sigmoid: bool = False,
    num_expert_group: int = 1,
    topk_group: int = 1,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE routing: the ``topk`` experts of each token by ``score + bias``, in the library order.

    Args:
        scores: fp32, bf16 or fp16 [T, E] router scores (after sigmoid), or logits with
            ``apply_sigmoid``; contiguous, E <= 1024. bf16 and fp16 widen to fp32 exactly.
        bias: fp32 (or the scores' dtype) [E] selection bias (the correction bias); it ranks
            experts but is not part of the weights. Keys are ``score + bias`` in fp32.
        topk: experts per token, 1 <= topk <= min(32, topk_group * E / num_expert_group).
        renormalize: divide the selected weights by their sum (a sum that is not > 0 divides by 1;
            no finite scores overflow it; +inf scores share the weight evenly, the others get 0).
        scale: multiply the final weights by this (the routed scaling factor).
        apply_sigmoid: ``scores`` are logits; the op applies the sigmoid first (in fp32).
        num_expert_group: groups of E / num_expert_group consecutive experts (DeepSeek-V3: 8),
            1..32, dividing E. A group's score is the fp32 sum of its two best keys.
        topk_group: groups kept (DeepSeek-V3: 4), the best by group score, ties to the lower group
            id; experts are chosen only inside them.
        out: optional (weights [T, topk] fp32 or the scores' dtype, ids int32 [T, topk]) to write
            into.

    Returns:
        ``(weights, ids)``, column 0 the best expert. A NaN score or NaN key ranks as -inf and gets
        weight 0; -0.0 ties +0.0; equal keys go to the lower expert id. Ids are always ``topk``
        distinct valid experts, also for all-NaN or all-equal rows.
    """
    check_is_tensor(scores, "scores")
    topk, num_expert_group, topk_group = check_route_args(topk, renormalize, scale, num_expert_group, topk_group)
    check_scalar(apply_sigmoid, "apply_sigmoid", bool)
    if out is None:
        tokens = scores.shape[0] if scores.dim() == 2 else 0
        out = (
            torch.empty(tokens, topk, dtype=torch.float32, device=scores.device),
            torch.empty(tokens, topk, dtype=torch.int32, device=scores.device),
        )
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (weights, ids) pair of tensors, got {type(out).__name__} "
                        f"of {len(out) if isinstance(out, (tuple, list)) else 1}")
    weights, ids = out
    torch.ops.sparse_decode.moe_route(scores, bias, topk, renormalize, float(scale), apply_sigmoid, num_expert_group,
                                      topk_group, weights, ids)
    return weights, ids
