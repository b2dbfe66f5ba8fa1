"""The exact pure-torch reference of ``indexer_topk_fused``: its CPU kernel and the tests' subject."""

from __future__ import annotations

import torch

from ...order import by_row_chunks, windows
from ..indexer_topk.reference import indexer_topk


def selected_outputs(ids: torch.Tensor, scores: torch.Tensor, page_table: torch.Tensor | None, page_size: int,
                     out: torch.Tensor, raw: torch.Tensor | None, values: torch.Tensor | None) -> None:
    """``ids`` (-1 padded) to the outputs: ``out`` gets them through the page table when there is
    one (``page_table[r, id // page_size] * page_size + id % page_size``), ``raw`` the ids,
    ``values`` the scores at them (-inf at the padding). ``scores``: the rows the ids index."""
    live = ids >= 0
    at = ids.clamp(min=0).long()
    if page_table is None:
        out.copy_(ids)
    else:
        pages = torch.gather(page_table.long(), 1, at // page_size) if at.numel() else at
        out.copy_(torch.where(live, pages * page_size + at % page_size, -1))
    if raw is not None:
        raw.copy_(ids)
    if values is not None:
        picked = torch.gather(scores, 1, at) if at.numel() and scores.shape[1] else values.new_zeros(values.shape)
        values.copy_(torch.where(live, picked, float("-inf")).to(values.dtype))


@by_row_chunks
def indexer_topk_fused(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor,
                       ids: torch.Tensor | None, values: torch.Tensor | None, page_table: torch.Tensor | None,
                       page_size: int, row_starts: torch.Tensor | None = None) -> None:
    """``indexer_topk``'s positions, then mapped to KV slots through ``page_table`` (into ``out``;
    without a table ``out`` gets the positions), the raw positions into ``ids`` and the scores at
    them into ``values``."""
    picked = torch.empty_like(out)
    indexer_topk(scores, lengths, k, picked, row_starts)
    rows = scores if row_starts is None else windows(scores, row_starts, lengths)[0]
    selected_outputs(picked, rows, page_table, page_size, out, ids, values)
