"""The exact pure-torch reference of ``select_candidate_blocks_fused``: its CPU kernel and the
tests' subject."""

from __future__ import annotations

import torch

from ...order import by_row_chunks
from ..indexer_topk_fused.reference import selected_outputs
from ..select_candidate_blocks.reference import select_candidate_blocks


@by_row_chunks
def select_candidate_blocks_fused(logits: torch.Tensor, lengths: torch.Tensor, block_size: int, k: int,
                                  out: torch.Tensor, ids: torch.Tensor | None, block_table: torch.Tensor,
                                  row_starts: torch.Tensor | None = None) -> None:
    """``select_candidate_blocks``' block ids mapped through ``block_table`` (``out[i, j] =
    block_table[i, id]``, -1 padded), the raw block ids into ``ids``."""
    picked = torch.empty_like(out)
    select_candidate_blocks(logits, lengths, block_size, k, picked, row_starts)
    selected_outputs(picked, logits, block_table, 1, out, ids, None)
