"""``sparse_decode::indexer_topk``: its argument check, its registration and its Python wrapper."""

from __future__ import annotations

import torch

from ..._library import check_int, check_topk_rows, define_op, topk_out
from ...dtypes import TOPK_SCORES
from ...limits import TOPK_MAX_K
from . import reference


def check_indexer_topk(scores, lengths, k, out, row_starts=None) -> None:
    check_topk_rows(scores, "scores", TOPK_SCORES, lengths, k, out, row_starts)



define_op("indexer_topk", ("out",), check_indexer_topk, cuda=f"{__package__}.kernel")(reference.indexer_topk)


def indexer_topk(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    row_starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact top-k token positions of each row's valid prefix (the DSA indexer's selection), or
    of its window ``[row_starts[i], lengths[i])`` (ragged rows of one buffer, prefill chunks).

    Args:
        scores: fp32, bf16 or fp16 [rows, width] (unit stride in the last dim, rows <= 65535,
            width <= 2**20).
        lengths: int32 [rows] valid lengths (with ``row_starts``: window ends), clamped to
            [0, width].
        k: positions to select, 1..4096.
        row_starts: optional int32 [rows] window starts, clamped to [0, end]; a start at or past
            the end is an empty row. The work follows the window, not the width.
        out: optional int32 [rows, k] to write into.

    Returns:
        int32 [rows, k]: the selected positions ascending, then -1 padding. With ``row_starts``
        they count from the window's start (position ``p`` is column ``row_starts[i] + p``), the
        request-relative positions a paged KV lookup takes.
    """
    k = check_int(k, "k", 1, TOPK_MAX_K)
    if out is None:
        out = topk_out(scores, "scores", k)
    torch.ops.sparse_decode.indexer_topk(scores, lengths, k, out, row_starts)
    return out
