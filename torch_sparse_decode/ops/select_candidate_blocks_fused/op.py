"""``sparse_decode::select_candidate_blocks_fused``: its argument check, its registration and its
Python wrapper."""

from __future__ import annotations

import torch

from ..._library import INT32, SCORE_DTYPES, check_int, check_no_overlap, check_output, check_same_device, \
    check_tensor, check_topk_rows, define_op
from ...limits import MAX_BLOCK_SIZE, TOPK_MAX_K
from ..indexer_topk_fused.op import FusedTopk
from . import reference


def check_select_candidate_blocks_fused(logits, lengths, block_size, k, out, ids, block_table,
                                        row_starts=None) -> None:
    check_topk_rows(logits, "logits", SCORE_DTYPES, lengths, k, out, row_starts)
    block_size = check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)
    rows, width = logits.shape
    check_tensor(block_table, "block_table", dtypes=INT32, ndim=2, contiguous=False, inner_contiguous=True)
    blocks = -(-width // block_size)
    if block_table.shape[0] != rows or block_table.shape[1] < blocks:
        raise ValueError(f"block_table must have {rows} rows of at least {blocks} blocks (logits' {width} columns "
                         f"in blocks of {block_size}), got {tuple(block_table.shape)}")
    check_same_device(logits, "logits", block_table=block_table)
    outputs = {"out": out}
    if ids is not None:
        outputs["ids"] = check_output(ids, "ids", torch.int32, (rows, k), logits, "logits")
    check_no_overlap(outputs, {"logits": logits, "lengths": lengths, "block_table": block_table,
                               "row_starts": row_starts})


def _kernel():
    from . import kernel

    return kernel


define_op("select_candidate_blocks_fused", ("out", "ids"), check_select_candidate_blocks_fused, cuda=_kernel)(
    reference.select_candidate_blocks_fused
)


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
    rows = logits.shape[0] if isinstance(logits, torch.Tensor) and logits.dim() >= 1 else 0
    device = logits.device if isinstance(logits, torch.Tensor) else None
    out = torch.empty(rows, k, dtype=torch.int32, device=device)
    raw = torch.empty(rows, k, dtype=torch.int32, device=device) if ids else None
    torch.ops.sparse_decode.select_candidate_blocks_fused(logits, lengths, block_size, k, out, raw, block_table,
                                                          row_starts)
    return FusedTopk(out, raw, None)
