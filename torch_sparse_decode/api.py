"""Public entry points: thin wrappers that allocate the outputs and call ``torch.ops.sparse_decode``.

Inside a CUDA graph pass ``out=`` tensors you own (or call the ops directly) so the captured
region holds no allocation; the ops themselves never allocate, sync or branch on data.
"""

from __future__ import annotations

import torch

from . import ops  # noqa: F401  (registers the ops)
from ._library import check_int, check_is_tensor, check_scalar


def moe_route(
    scores: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    *,
    renormalize: bool = True,
    scale: float = 1.0,
    apply_sigmoid: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE routing: the ``topk`` experts of each token by ``score + bias``, in the library order.

    Args:
        scores: fp32 [T, E] router scores (after sigmoid), or logits with ``apply_sigmoid``;
            contiguous, E <= 1024.
        bias: fp32 [E] selection bias (the correction bias); it ranks experts but is not part of
            the weights.
        topk: experts per token, 1 <= topk <= min(16, E).
        renormalize: divide the selected weights by their sum (a sum that is not > 0 divides by 1;
            no finite scores overflow it; +inf scores share the weight evenly, the others get 0).
        scale: multiply the final weights by this (the routed scaling factor).
        apply_sigmoid: ``scores`` are logits; the op applies the sigmoid first.
        out: optional (weights fp32 [T, topk], ids int32 [T, topk]) to write into.

    Returns:
        ``(weights, ids)``, column 0 the best expert. A NaN score or NaN key ranks as -inf and gets
        weight 0; -0.0 ties +0.0; equal keys go to the lower expert id. Ids are always ``topk``
        distinct valid experts, also for all-NaN or all-equal rows.
    """
    # Scalars are checked here: the dispatcher would reject a wrong type with a RuntimeError.
    check_is_tensor(scores, "scores")
    topk = check_int(topk, "topk", 1, ops.MOE_MAX_TOPK)
    check_scalar(renormalize, "renormalize", bool)
    check_scalar(scale, "scale", float)
    check_scalar(apply_sigmoid, "apply_sigmoid", bool)
    if out is None:
        tokens = scores.shape[0] if scores.dim() == 2 else 0
        out = (
            torch.empty(tokens, topk, dtype=torch.float32, device=scores.device),
            torch.empty(tokens, topk, dtype=torch.int32, device=scores.device),
        )
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (weights, ids) pair of tensors, got {type(out).__name__} "
                        f"of {len(out) if isinstance(out, (tuple, list)) else 1}")
    weights, ids = out
    torch.ops.sparse_decode.moe_route(scores, bias, topk, renormalize, float(scale), apply_sigmoid, weights, ids)
    return weights, ids


def _out_rows(like: torch.Tensor, name: str, k: int) -> torch.Tensor:
    check_is_tensor(like, name)
    rows = like.shape[0] if like.dim() >= 1 else 0
    return torch.empty(rows, k, dtype=torch.int32, device=like.device)


def select_candidate_blocks(
    logits: torch.Tensor,
    row_ends: torch.Tensor,
    block_size: int,
    k: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidate block selection for sparse-attention decode (SPEC 2.2).

    Args:
        logits: fp32 [rows, width] block logits (unit stride in the last dim, rows <= 65535,
            width <= 2**20); row i is valid below ``row_ends[i]``.
        row_ends: int32 [rows] valid lengths in columns, clamped to [0, width].
        block_size: columns per block, 1..256; row i has ``ceil(row_ends[i] / block_size)``
            valid blocks, each scored by the max of its valid columns (NaN ignored).
        k: blocks to select, 1..4096.
        out: optional int32 [rows, k] to write into.

    Returns:
        int32 [rows, k]: the newest valid block plus the best ``k - 1`` other valid blocks in the
        library order, ascending, then -1 padding.
    """
    block_size = check_int(block_size, "block_size", 1, ops.MAX_BLOCK_SIZE)
    k = check_int(k, "k", 1, ops.TOPK_MAX_K)
    if out is None:
        out = _out_rows(logits, "logits", k)
    elif isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] != k:
        raise ValueError(f"out must have k = {k} columns, got {out.shape[1]}")
    torch.ops.sparse_decode.select_candidate_blocks(logits, row_ends, block_size, out)
    return out


def indexer_topk(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact top-k token positions of each row's valid prefix (the DSA indexer's selection).

    Args:
        scores: fp32 or bf16 [rows, width] (unit stride in the last dim, rows <= 65535,
            width <= 2**20).
        lengths: int32 [rows] valid lengths, clamped to [0, width].
        k: positions to select, 1..4096.
        out: optional int32 [rows, k] to write into.

    Returns:
        int32 [rows, k]: the selected positions ascending, then -1 padding.
    """
    k = check_int(k, "k", 1, ops.TOPK_MAX_K)
    if out is None:
        out = _out_rows(scores, "scores", k)
    torch.ops.sparse_decode.indexer_topk(scores, lengths, k, out)
    return out
