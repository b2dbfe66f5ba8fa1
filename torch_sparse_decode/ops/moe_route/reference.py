"""The exact pure-torch reference of ``moe_route``: its CPU kernel and the test oracle's subject."""

from __future__ import annotations

import torch

from ...order import canonical, composite_key, topk_by_key


def moe_route(
    scores: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    renormalize: bool,
    scale: float,
    apply_sigmoid: bool,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> None:
    """Top-``topk`` experts by ``score + bias``; weights from the unbiased scores."""
    num_experts = scores.shape[1]
    score = torch.sigmoid(scores) if apply_sigmoid else scores
    key = score + bias
    invalid = torch.isnan(score) | torch.isnan(key)
    score = torch.where(invalid, 0.0, score)
    experts = torch.arange(num_experts, device=scores.device)
    keys = composite_key(canonical(torch.where(invalid, float("-inf"), key)), experts)
    _, chosen = topk_by_key(keys, topk)
    picked = score.gather(1, chosen)
    if renormalize:
        picked = renormalized(picked)
    weights.copy_(picked * scale)
    ids.copy_(chosen)


def renormalized(picked: torch.Tensor) -> torch.Tensor:
    """Each row of selected weights divided by its sum: a sum that is not > 0 divides by 1.

    The sum is taken in float64, so no finite fp32 scores overflow it (32 of them at fp32's
    largest sum to 1.1e40). Where a row holds +inf scores, those share the weight evenly and the
    others get 0 (inf / inf would be NaN)."""
    infinite = picked == float("inf")
    count = infinite.sum(dim=1, keepdim=True)
    total = picked.double().sum(dim=1, keepdim=True)
    finite = (picked.double() / torch.where(total > 0, total, 1.0)).float()
    shared = torch.where(infinite, 1.0 / count.clamp(min=1).float(), 0.0)
    return torch.where(count > 0, shared, finite)


