"""The exact pure-torch reference of ``select_candidate_blocks``: its CPU kernel and the test oracle's subject."""

from __future__ import annotations

import torch

from ...order import (KEY_NONE, ascending_ids, by_row_chunks, canonical, clamped_lengths, prefix_keys, topk_by_key,
                     windows)


def block_scores(logits: torch.Tensor, lengths: torch.Tensor, block_size: int) -> torch.Tensor:
    """fp32 [rows, ceil(width / block_size)]: max over each block's valid columns, canonical.

    NaN columns are ignored (a block of only NaN scores -inf); blocks past the valid prefix score
    -inf too, and are excluded by the caller, which knows how many blocks are valid.
    """
    rows, width = logits.shape
    num_blocks = -(-width // block_size)
    ends = clamped_lengths(lengths, width)
    columns = torch.arange(width, device=logits.device)
    values = torch.where(columns < ends[:, None], canonical(logits), float("-inf"))
    padded = values.new_full((rows, num_blocks * block_size), float("-inf"))
    padded[:, :width] = values
    return padded.view(rows, num_blocks, block_size).amax(dim=2)


@by_row_chunks
def select_candidate_blocks(
    logits: torch.Tensor, lengths: torch.Tensor, block_size: int, k: int, out: torch.Tensor,
    row_starts: torch.Tensor | None = None,
) -> None:
    """Newest valid block plus the best ``k - 1`` other valid blocks, ascending, -1 padded. With
    ``row_starts``, the blocks of each row's window ``[row_starts, lengths)``, counted from its
    start."""
    if row_starts is not None:
        logits, lengths = windows(logits, row_starts, lengths)
    width = logits.shape[1]
    scores = block_scores(logits, lengths, block_size)
    valid_blocks = (clamped_lengths(lengths, width) + block_size - 1) // block_size
    newest = valid_blocks - 1
    # The newest block is taken apart (pinned), so the others compete for k - 1 slots.
    others = prefix_keys(scores, newest.clamp(min=0))
    best, index = topk_by_key(others, k - 1)
    ids = torch.cat([index, newest[:, None]], dim=1)
    live = torch.cat([best != KEY_NONE, (valid_blocks > 0)[:, None]], dim=1)
    out.copy_(ascending_ids(ids, live, k))
