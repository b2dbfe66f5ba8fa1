"""``sparse_decode::select_candidate_blocks``: its argument check, its registration and its Python
wrapper."""

from __future__ import annotations

import torch

from ..._library import check_int, check_topk_rows, define_op, topk_out
from ...dtypes import TOPK_SCORES
from ...limits import MAX_BLOCK_SIZE, TOPK_MAX_K
from . import reference


def check_select_candidate_blocks(logits, lengths, block_size, k, out, row_starts=None) -> None:
    check_topk_rows(logits, "logits", TOPK_SCORES, lengths, k, out, row_starts)
    check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)



define_op("select_candidate_blocks", ("out",), check_select_candidate_blocks, cuda=f"{__package__}.kernel")(
    reference.select_candidate_blocks
)


def select_candidate_blocks(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    k: int,
    *,
    row_starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidate block selection for sparse-attention decode.

    Args:
        logits: fp32, bf16 or fp16 [rows, width] token logits (widened to fp32 exactly) (unit stride
            in the last dim, rows <= 65535, width <= 2**20); row i is valid below ``lengths[i]``.
        lengths: int32 [rows] valid lengths in columns (tokens), clamped to [0, width].
        block_size: columns per block, 1..256; row i has ``ceil(lengths[i] / block_size)``
            valid blocks, each scored by the max of its valid columns (NaN ignored).
        k: blocks to select, 1..4096.
        row_starts: optional int32 [rows]: row i's window is columns ``[row_starts[i],
            lengths[i])`` (the start clamped to [0, end]; at or past the end: an empty row), and
            its blocks count from the window's start (block ``b`` covers columns
            ``row_starts[i] + b * block_size`` on).
        out: optional int32 [rows, k] to write into.

    Returns:
        int32 [rows, k]: the newest valid block plus the best ``k - 1`` other valid blocks in the
        library order, ascending, then -1 padding.
    """
    block_size = check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)
    k = check_int(k, "k", 1, TOPK_MAX_K)
    if out is None:
        out = topk_out(logits, "logits", k)
    torch.ops.sparse_decode.select_candidate_blocks(logits, lengths, block_size, k, out, row_starts)
    return out
