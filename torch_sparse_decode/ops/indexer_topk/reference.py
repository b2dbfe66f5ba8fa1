"""The exact pure-torch reference of ``indexer_topk``: its CPU kernel and the test oracle's subject."""

from __future__ import annotations

import torch

from ...order import ascending_topk, clamped_lengths, prefix_keys


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """Exact top-``k`` token positions of each row's valid prefix, ascending, -1 padded."""
    ends = clamped_lengths(lengths, scores.shape[1])
    out.copy_(ascending_topk(prefix_keys(scores, ends), k))
