"""``sparse_decode::decode_row_lengths``: its argument check, its registration and its Python
wrapper."""

from __future__ import annotations

import torch

from ..._library import (INT32, check_int, check_no_overlap, check_rows, check_same_device, check_shape, check_tensor,
                         define_op)
from ...limits import MAX_NEXT_N
from . import reference


def check_decode_row_lengths(seq_lens, next_n, out) -> None:
    check_tensor(seq_lens, "seq_lens", dtypes=INT32, ndim=1)
    next_n = check_int(next_n, "next_n", 1, MAX_NEXT_N)
    check_rows(seq_lens.shape[0] * next_n, "the step (seq_lens.shape[0] * next_n)")
    check_tensor(out, "out", dtypes=INT32, ndim=1)
    check_shape(out, "out", (seq_lens.shape[0] * next_n,))
    check_same_device(seq_lens, "seq_lens", out=out)
    check_no_overlap({"out": out}, {"seq_lens": seq_lens})



define_op("decode_row_lengths", ("out",), check_decode_row_lengths, cuda=f"{__package__}.kernel")(
    reference.decode_row_lengths)


def decode_row_lengths(seq_lens: torch.Tensor, next_n: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The valid length of every query row of an MTP / speculative decode step, for the top-k ops.

    Request b has ``seq_lens[b]`` tokens in its KV cache, its ``next_n`` newest being this step's
    query tokens; its row j (row ``b * next_n + j`` of the step's scores) sees the tokens up to
    its own: ``max(seq_lens[b] - next_n + j + 1, 0)``. One launch, no host sync, CUDA-graph safe.

    Args:
        seq_lens: int32 [B], contiguous.
        next_n: query tokens per request, 1..1024; B * next_n rows at most 65535 (the top-k ops'
            row limit).
        out: optional int32 [B * next_n] to write into.

    Returns:
        int32 [B * next_n]: the ``lengths`` argument of ``indexer_topk`` and
        ``select_candidate_blocks`` for the step's rows.
    """
    next_n = check_int(next_n, "next_n", 1, MAX_NEXT_N)
    if out is None:
        check_tensor(seq_lens, "seq_lens", dtypes=INT32, ndim=1)
        check_rows(seq_lens.shape[0] * next_n, "the step (seq_lens.shape[0] * next_n)")
        out = torch.empty(seq_lens.shape[0] * next_n, dtype=torch.int32, device=seq_lens.device)
    torch.ops.sparse_decode.decode_row_lengths(seq_lens, next_n, out)
    return out
