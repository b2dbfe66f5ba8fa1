"""The CUDA kernel of ``indexer_topk``: the top-k engine over the scores themselves."""

from __future__ import annotations

import torch

from ...kernels import topk as engine


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor,
                 row_starts: torch.Tensor | None = None) -> None:
    """The CUDA kernel of ``sparse_decode::indexer_topk`` (arguments already checked)."""
    engine.select(scores, lengths, scores.shape[1], 1, k, out, pinned=False, starts=row_starts)

