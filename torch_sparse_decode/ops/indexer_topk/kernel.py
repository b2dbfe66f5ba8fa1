"""The CUDA kernel of ``indexer_topk``: the top-k engine over the scores themselves."""

from __future__ import annotations

import torch

from ...kernels import topk as engine


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor,
                 row_starts: torch.Tensor | None = None) -> None:
    """The CUDA kernel of ``sparse_decode::indexer_topk`` (arguments already checked)."""
    engine.select(scores, lengths, scores.shape[1], 1, k, out, pinned=False, starts=row_starts)


def warm_triton(device: torch.device) -> None:
    """The count select (where switched on) at each width it is built for, each score dtype, with
    and without windows (``kernels/triton_cache``)."""
    from ...kernels.topk import count_select

    if not count_select.COUNT_SELECT:
        return
    lengths = torch.ones(1, dtype=torch.int32, device=device)
    out = torch.empty(1, 2048, dtype=torch.int32, device=device)
    block = count_select.MIN_BLOCK
    while block <= count_select.COUNT_MAX:
        for dtype in count_select.STEPS:
            scores = torch.zeros(1, block, dtype=dtype, device=device)
            for starts in (None, lengths):
                count_select.count_select(scores, lengths, starts, block, 2048, out)
        block *= 2
