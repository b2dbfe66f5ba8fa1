"""``sparse_decode::select_candidate_blocks_fused``: its argument check, its registration and its
Python wrapper."""

from __future__ import annotations

import torch

from ..._library import check_int, check_no_overlap, check_output, check_table, check_topk_rows, \
    define_op, topk_out
from ...dtypes import TOPK_SCORES
from ...limits import MAX_BLOCK_SIZE, TOPK_MAX_K
from ..indexer_topk_fused.op import FusedTopk
from . import reference


def check_select_candidate_blocks_fused(logits, lengths, block_size, k, out, ids, block_table,
                                        row_starts=None) -> None:
    check_topk_rows(logits, "logits", TOPK_SCORES, lengths, k, out, row_starts)
    block_size = check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)
    rows = logits.shape[0]
    check_table(block_table, "block_table", logits, "logits", block_size, "blocks")
    outputs = {"out": out}
    if ids is not None:
        outputs["ids"] = check_output(ids, "ids", torch.int32, (rows, k), logits, "logits")
    check_no_overlap(outputs, {"logits": logits, "lengths": lengths, "block_table": block_table,
                               "row_starts": row_starts})



define_op("select_candidate_blocks_fused", ("out", "ids"), check_select_candidate_blocks_fused,
          cuda=f"{__package__}.kernel")(reference.select_candidate_blocks_fused)


def select_candidate_blocks_fused(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    k: int,
    block_table: torch.Tensor,
    *,
    ids: bool = False,
    row_starts: torch.Tensor | None = None,
) -> FusedTopk:
    """``select_candidate_blocks`` with each selected block id mapped through ``block_table``
    (int32 [rows, >= ceil(width / block_size)]: ``out[i, j] = block_table[i, id]``, in the order
    of the ids, -1 padded) in the selection's output stage (no extra launch); ``ids=True``: the
    raw block ids too. Returns ``FusedTopk(out, ids or None, None)``."""
    block_size = check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)
    k = check_int(k, "k", 1, TOPK_MAX_K)
    out = topk_out(logits, "logits", k)
    raw = torch.empty_like(out) if ids else None
    torch.ops.sparse_decode.select_candidate_blocks_fused(logits, lengths, block_size, k, out, raw, block_table,
                                                          row_starts)
    return FusedTopk(out, raw, None)
