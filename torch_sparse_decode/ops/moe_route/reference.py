"""The exact pure-torch reference of ``moe_route``: its CPU kernel and the test oracle's subject."""

from __future__ import annotations

import torch

from ...order import KEY_NONE, canonical, composite_key, topk_by_key


def moe_route(
    scores: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    renormalize: bool,
    scale: float,
    apply_sigmoid: bool,
    num_expert_group: int,
    topk_group: int,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> None:
    """Top-``topk`` experts by ``score + bias`` (fp32), inside the ``topk_group`` best of
    ``num_expert_group`` expert groups; weights from the unbiased scores."""
    num_experts = scores.shape[1]
    score = scores.float()  # bf16 / fp16 widen exactly
    if apply_sigmoid:
        score = torch.sigmoid(score)
    key = score + bias.float()
    invalid = torch.isnan(score) | torch.isnan(key)
    score = torch.where(invalid, 0.0, score)
    key = canonical(torch.where(invalid, float("-inf"), key))
    keys = composite_key(key, torch.arange(num_experts, device=scores.device))
    if num_expert_group > 1:
        keys = torch.where(kept_experts(key, num_expert_group, topk_group), keys, KEY_NONE)
    _, chosen = topk_by_key(keys, topk)
    picked = score.gather(1, chosen)
    if renormalize:
        picked = renormalized(picked)
    weights.copy_(picked * scale)
    ids.copy_(chosen)


def group_scores(key: torch.Tensor, num_expert_group: int) -> torch.Tensor:
    """fp32 [T, groups]: the sum of each group's two best keys (its one key for groups of one),
    canonical (a sum of +inf and -inf is NaN, which ranks as -inf). ``key`` is canonical."""
    tokens, num_experts = key.shape
    size = num_experts // num_expert_group
    best = torch.topk(key.view(tokens, num_expert_group, size), min(2, size), dim=2).values
    total = best[..., 0] + best[..., 1] if size > 1 else best[..., 0]
    return canonical(total)


def kept_experts(key: torch.Tensor, num_expert_group: int, topk_group: int) -> torch.Tensor:
    """bool [T, E]: the experts of the ``topk_group`` best groups (ties to the lower group id)."""
    tokens, num_experts = key.shape
    groups = torch.arange(num_expert_group, device=key.device)
    _, best = topk_by_key(composite_key(group_scores(key, num_expert_group), groups), topk_group)
    kept = torch.zeros(tokens, num_expert_group, dtype=torch.bool, device=key.device).scatter_(1, best, True)
    return kept.repeat_interleave(num_experts // num_expert_group, dim=1)


def warp_sum(x: torch.Tensor) -> torch.Tensor:
    """[T, n <= 32] -> [T, 1]: the row summed as a warp's butterfly adds it (lanes past n hold 0):
    adjacent pairs, then pairs of pairs. A fixed order, so every device gets the same bits."""
    x = torch.nn.functional.pad(x, (0, 32 - x.shape[1]))
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x


def renormalized(picked: torch.Tensor) -> torch.Tensor:
    """Each row of selected weights divided by its fp32 sum (``warp_sum``): a sum that is not > 0
    divides by 1. A sum that overflowed (finite weights only) is taken again on the weights scaled
    by 2**-8, exact for weights that large, so no finite scores overflow it (32 of fp32's largest
    sum to 1.1e40). Where a row holds +inf scores, those share the weight evenly and the others get
    0 (inf / inf would be NaN)."""
    total = warp_sum(picked)
    infinite = picked == float("inf")
    count = infinite.sum(dim=1, keepdim=True)
    scaled = picked * (1.0 / 256)
    rescaled = warp_sum(scaled)
    plain = torch.where(total > 0, picked / total, picked)
    overflowed = torch.where(rescaled > 0, scaled / rescaled, picked)
    shared = torch.where(infinite, 1.0 / count.clamp(min=1).float(), 0.0)
    return torch.where(torch.isfinite(total), plain, torch.where(count > 0, shared, overflowed))
