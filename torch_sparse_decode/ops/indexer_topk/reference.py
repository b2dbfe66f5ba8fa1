"""The exact pure-torch reference of ``indexer_topk``: its CPU kernel and the test oracle's subject."""

from __future__ import annotations

import torch

from ...order import ascending_topk, by_row_chunks, clamped_lengths, prefix_keys, windows


@by_row_chunks
def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor,
                 row_starts: torch.Tensor | None = None) -> None:
    """Exact top-``k`` token positions of each row's valid prefix (or of its window
    ``[row_starts, lengths)``, positions counted from its start), ascending, -1 padded."""
    if row_starts is not None:
        scores, lengths = windows(scores, row_starts, lengths)
    ends = clamped_lengths(lengths, scores.shape[1])
    out.copy_(ascending_topk(prefix_keys(scores, ends), k))
