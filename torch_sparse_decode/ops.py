"""Registration of every ``torch.ops.sparse_decode.*`` op: its argument check and its reference.

Each op writes into caller-owned outputs and returns nothing (CUDA-graph friendly). The names here
are the names of the references (``reference.py``) and of the kernels (``kernels/``).
"""

from __future__ import annotations

import math

import torch

from . import reference
from ._library import (
    check_int,
    check_no_overlap,
    check_same_device,
    check_scalar,
    check_shape,
    check_tensor,
    define_op,
)
from .dcp_config import (
    LOCAL_INDEX_BITS,
    MAX_WORLD_SIZE,
    dcp_merge_local_topk,
    packed_row_words,
    rescue_row_slots,
)

# Contract limits, the same on every device so that no call works on the CPU and fails on the GPU.
MOE_MAX_EXPERTS = 1024
MOE_MAX_TOPK = 16
TOPK_MAX_K = 4096
TOPK_MAX_WIDTH = 1 << 20
TOPK_MAX_ROWS = 65535  # the CUDA engine puts rows on a grid dimension capped there
MAX_BLOCK_SIZE = 256

_FLOAT = (torch.float32,)
_SCORES = (torch.float32, torch.bfloat16)
_INT32 = (torch.int32,)


def _check_lengths(lengths: object, name: str, rows: int) -> torch.Tensor:
    check_tensor(lengths, name, dtypes=_INT32, ndim=1)
    check_shape(lengths, name, (rows,))
    return lengths


# --------------------------------------------------------------------------------- moe_route


def check_moe_route(scores, bias, topk, renormalize, scale, apply_sigmoid, weights, ids) -> None:
    check_tensor(scores, "scores", dtypes=_FLOAT, ndim=2)
    tokens, experts = scores.shape
    if not 1 <= experts <= MOE_MAX_EXPERTS:
        raise ValueError(f"scores must have 1 to {MOE_MAX_EXPERTS} experts (columns), got {experts}")
    check_tensor(bias, "bias", dtypes=_FLOAT, ndim=1)
    check_shape(bias, "bias", (experts,))
    check_int(topk, "topk", 1, min(MOE_MAX_TOPK, experts))
    check_scalar(renormalize, "renormalize", bool)
    check_scalar(apply_sigmoid, "apply_sigmoid", bool)
    check_scalar(scale, "scale", float)
    if isinstance(scale, (int, float)) and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    check_tensor(weights, "weights", dtypes=_FLOAT, ndim=2)
    check_shape(weights, "weights", (tokens, topk))
    check_tensor(ids, "ids", dtypes=_INT32, ndim=2)
    check_shape(ids, "ids", (tokens, topk))
    check_same_device(scores, "scores", bias=bias, weights=weights, ids=ids)
    check_no_overlap({"weights": weights, "ids": ids}, {"scores": scores, "bias": bias})


moe_route = define_op("moe_route", ("weights", "ids"), check_moe_route)(reference.moe_route)


# ------------------------------------------------------------------- select_candidate_blocks


def _check_topk_rows(scores, scores_name, dtypes, lengths, lengths_name, out):
    check_tensor(scores, scores_name, dtypes=dtypes, ndim=2, contiguous=False, inner_contiguous=True)
    rows, width = scores.shape
    if width > TOPK_MAX_WIDTH:
        raise ValueError(f"{scores_name} may have at most {TOPK_MAX_WIDTH} columns, got {width}")
    _check_rows(rows, scores_name)
    _check_lengths(lengths, lengths_name, rows)
    check_tensor(out, "out", dtypes=_INT32, ndim=2)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows (one per {scores_name} row), got {out.shape[0]}")
    check_int(out.shape[1], "out.shape[1] (k)", 1, TOPK_MAX_K)
    check_same_device(scores, scores_name, **{lengths_name: lengths, "out": out})
    check_no_overlap({"out": out}, {scores_name: scores, lengths_name: lengths})


def check_select_candidate_blocks(logits, row_ends, block_size, out) -> None:
    _check_topk_rows(logits, "logits", _FLOAT, row_ends, "row_ends", out)
    check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)


select_candidate_blocks = define_op("select_candidate_blocks", ("out",), check_select_candidate_blocks)(
    reference.select_candidate_blocks
)


# ------------------------------------------------------------------------------ indexer_topk


def check_indexer_topk(scores, lengths, k, out) -> None:
    check_int(k, "k", 1, TOPK_MAX_K)
    _check_topk_rows(scores, "scores", _SCORES, lengths, "lengths", out)
    if out.shape[1] != k:
        raise ValueError(f"out must have k = {k} columns, got {out.shape[1]}")


indexer_topk = define_op("indexer_topk", ("out",), check_indexer_topk)(reference.indexer_topk)


# ---------------------------------------------------------------------------------- DCP merge


def _check_rows(rows: int, name: str) -> None:
    if rows > TOPK_MAX_ROWS:
        raise ValueError(f"{name} may have at most {TOPK_MAX_ROWS} rows, got {rows}")


def _check_dcp_scores(scores, lengths, world_size, rank, topk, max_length: int) -> None:
    check_tensor(scores, "scores", dtypes=_SCORES, ndim=2, contiguous=False, inner_contiguous=True)
    _check_rows(scores.shape[0], "scores")
    if scores.shape[1] > max_length:
        raise ValueError(f"scores may have at most {max_length} local tokens (columns), got {scores.shape[1]}")
    _check_lengths(lengths, "lengths", scores.shape[0])
    check_int(world_size, "world_size", 1, MAX_WORLD_SIZE)
    check_int(rank, "rank", 0, world_size - 1)
    check_int(topk, "topk", 1, TOPK_MAX_K)


def _one_round_local_topk(topk: int, world_size: int) -> int:
    local_topk = dcp_merge_local_topk(topk, world_size)
    if local_topk == 0:
        raise ValueError(
            f"the one-round merge needs dcp_merge_local_topk(topk={topk}, world_size={world_size}) > 0; "
            "use the generic merge"
        )
    return local_topk


def check_dcp_pack(scores, lengths, world_size, rank, topk, packed, rescue) -> None:
    _check_dcp_scores(scores, lengths, world_size, rank, topk, 1 << LOCAL_INDEX_BITS)
    rows = scores.shape[0]
    local_topk = _one_round_local_topk(topk, world_size)
    check_tensor(packed, "packed", dtypes=_INT32, ndim=2)
    check_shape(packed, "packed", (rows, packed_row_words(local_topk)))
    check_tensor(rescue, "rescue", dtypes=_INT32, ndim=2)
    check_shape(rescue, "rescue", (rows, packed_row_words(rescue_row_slots(topk))))
    check_same_device(scores, "scores", lengths=lengths, packed=packed, rescue=rescue)
    check_no_overlap({"packed": packed, "rescue": rescue}, {"scores": scores, "lengths": lengths})


dcp_pack = define_op("dcp_pack", ("packed", "rescue"), check_dcp_pack)(reference.dcp_pack)


def _check_merge_outputs(rows, topk, reference_tensor, name, global_ids, local_ids, local_count, **inputs):
    _check_rows(rows, name)
    check_tensor(global_ids, "global_ids", dtypes=_INT32, ndim=2)
    check_shape(global_ids, "global_ids", (rows, topk))
    check_tensor(local_ids, "local_ids", dtypes=_INT32, ndim=2)
    check_shape(local_ids, "local_ids", (rows, topk))
    check_tensor(local_count, "local_count", dtypes=_INT32, ndim=1)
    check_shape(local_count, "local_count", (rows,))
    check_same_device(reference_tensor, name, global_ids=global_ids, local_ids=local_ids, local_count=local_count)
    check_no_overlap({"global_ids": global_ids, "local_ids": local_ids, "local_count": local_count},
                     {name: reference_tensor, **inputs})


def check_dcp_merge(gathered, rescue, topk, rank, global_ids, local_ids, local_count) -> None:
    check_tensor(gathered, "gathered", dtypes=_INT32, ndim=3)
    world_size, rows, words = gathered.shape
    check_int(world_size, "gathered.shape[0] (world_size)", 2, MAX_WORLD_SIZE)
    check_int(topk, "topk", 1, TOPK_MAX_K)
    check_int(rank, "rank", 0, world_size - 1)
    local_topk = _one_round_local_topk(topk, world_size)
    check_shape(gathered, "gathered", (world_size, rows, packed_row_words(local_topk)))
    check_tensor(rescue, "rescue", dtypes=_INT32, ndim=3)
    check_shape(rescue, "rescue", (world_size, rows, packed_row_words(rescue_row_slots(topk))))
    check_same_device(gathered, "gathered", rescue=rescue)
    _check_merge_outputs(rows, topk, gathered, "gathered", global_ids, local_ids, local_count, rescue=rescue)


dcp_merge = define_op("dcp_merge", ("global_ids", "local_ids", "local_count"), check_dcp_merge)(
    reference.dcp_merge
)


def check_dcp_local_keys(scores, lengths, world_size, rank, topk, keys) -> None:
    # Global ids must fit the 32 bits of a merge key.
    _check_dcp_scores(scores, lengths, world_size, rank, topk, (1 << 31) // MAX_WORLD_SIZE)
    check_tensor(keys, "keys", dtypes=(torch.int64,), ndim=2)
    check_shape(keys, "keys", (scores.shape[0], topk))
    check_same_device(scores, "scores", lengths=lengths, keys=keys)
    check_no_overlap({"keys": keys}, {"scores": scores, "lengths": lengths})


dcp_local_keys = define_op("dcp_local_keys", ("keys",), check_dcp_local_keys)(reference.dcp_local_keys)


def check_dcp_merge_generic(gathered_keys, rank, global_ids, local_ids, local_count) -> None:
    check_tensor(gathered_keys, "gathered_keys", dtypes=(torch.int64,), ndim=3)
    world_size, rows, topk = gathered_keys.shape
    check_int(world_size, "gathered_keys.shape[0] (world_size)", 1, MAX_WORLD_SIZE)
    check_int(topk, "gathered_keys.shape[2] (topk)", 1, TOPK_MAX_K)
    check_int(rank, "rank", 0, world_size - 1)
    _check_merge_outputs(rows, topk, gathered_keys, "gathered_keys", global_ids, local_ids, local_count)


dcp_merge_generic = define_op(
    "dcp_merge_generic", ("global_ids", "local_ids", "local_count"), check_dcp_merge_generic
)(reference.dcp_merge_generic)


def check_dcp_topk_merge(scores, lengths, topk, group_name, global_ids, local_ids, local_count) -> None:
    _check_dcp_scores(scores, lengths, 1, 0, topk, (1 << 31) // MAX_WORLD_SIZE)
    check_scalar(group_name, "group_name", str)
    _check_merge_outputs(scores.shape[0], topk, scores, "scores", global_ids, local_ids, local_count,
                         lengths=lengths)


dcp_topk_merge = define_op(
    "dcp_topk_merge", ("global_ids", "local_ids", "local_count"), check_dcp_topk_merge
)(reference.dcp_topk_merge)
