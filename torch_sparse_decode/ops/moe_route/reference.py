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


def renormalized(picked: torch.Tensor) -> torch.Tensor:
    """Each row of selected weights divided by its sum: a sum that is not > 0 divides by 1.

    The sum is taken in float64, best expert first (a fixed order, so every device gets the same
    bits), and the division in float64 too: no finite fp32 scores overflow it (32 of them at fp32's
    largest sum to 1.1e40). Where a row holds +inf scores, those share the weight evenly and the
    others get 0 (inf / inf would be NaN)."""
    infinite = picked == float("inf")
    count = infinite.sum(dim=1, keepdim=True)
    total = torch.zeros(picked.shape[0], 1, dtype=torch.float64, device=picked.device)
    for j in range(picked.shape[1]):
        total = total + picked[:, j:j + 1].double()
    finite = (picked.double() / torch.where(total > 0, total, 1.0)).float()
    shared = torch.where(infinite, 1.0 / count.clamp(min=1).float(), 0.0)
    return torch.where(count > 0, shared, finite)
