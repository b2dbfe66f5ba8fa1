"""``sparse_decode::indexer_topk_fused``: its argument check, its registration and its Python
wrapper."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..._library import check_int, check_no_overlap, check_output, check_table, check_topk_rows, \
    define_op, topk_out
from ...dtypes import TOPK_SCORES
from ...limits import TOPK_MAX_K
from . import reference


def check_indexer_topk_fused(scores, lengths, k, out, ids, values, page_table, page_size, row_starts=None) -> None:
    check_topk_rows(scores, "scores", TOPK_SCORES, lengths, k, out, row_starts)
    rows = scores.shape[0]
    outputs = {"out": out}
    if page_table is None:
        if ids is not None:
            raise ValueError("ids (the raw positions) go beside the KV slots: pass page_table too")
        if page_size != 0:
            raise ValueError(f"page_size must be 0 without a page_table, got {page_size}")
    else:
        check_int(page_size, "page_size", 1, 1 << 20)
        check_table(page_table, "page_table", scores, "scores", page_size, "pages")
        if ids is not None:
            outputs["ids"] = check_output(ids, "ids", torch.int32, (rows, k), scores, "scores")
    if values is not None:
        outputs["values"] = check_output(values, "values", scores.dtype, (rows, k), scores, "scores")
    check_no_overlap(outputs, {"scores": scores, "lengths": lengths, "page_table": page_table,
                               "row_starts": row_starts})



define_op("indexer_topk_fused", ("out", "ids", "values"), check_indexer_topk_fused, cuda=f"{__package__}.kernel")(
    reference.indexer_topk_fused
)


class FusedTopk(NamedTuple):
    """``indexer_topk_fused``'s outputs: ``out`` (the KV slots, or the positions without a page
    table), and where asked for, the raw positions and the selected scores."""

    out: torch.Tensor
    ids: Optional[torch.Tensor]
    values: Optional[torch.Tensor]


def indexer_topk_fused(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    page_table: torch.Tensor | None = None,
    page_size: int = 0,
    ids: bool = False,
    values: bool = False,
    row_starts: torch.Tensor | None = None,
) -> FusedTopk:
    """``indexer_topk`` with its outputs fused into the selection's output stage (one launch):

    - with ``page_table`` (int32 [rows, pages]) and ``page_size``: the KV slots of the selected
      positions, ``page_table[i, p // page_size] * page_size + p % page_size``, ascending by
      position, -1 padded. The entries the positions reach must be pages, ``0 <= entry <
      2**31 // page_size`` (int32 slots); they are not checked (that would sync with the host);
    - ``ids=True`` (with a page table): the raw positions too;
    - ``values=True``: the selected scores in the scores' dtype, -inf at the padding.

    Positions are those of ``indexer_topk`` (counted from ``row_starts`` where given).
    """
    k = check_int(k, "k", 1, TOPK_MAX_K)
    out = topk_out(scores, "scores", k)
    raw = torch.empty_like(out) if ids else None
    picked = torch.empty_like(out, dtype=scores.dtype) if values else None
    torch.ops.sparse_decode.indexer_topk_fused(scores, lengths, k, out, raw, picked, page_table, page_size, row_starts)
    return FusedTopk(out, raw, picked)
