"""The DCP ops (``dcp_pack``, ``dcp_merge``, ``dcp_local_keys``, ``dcp_merge_generic``,
``dcp_topk_merge``): their argument checks and registrations. The process-group entry points and
the Python wrappers are ``torch_sparse_decode.dcp``."""

from __future__ import annotations

import torch

from ..._library import (
    INT32,
    check_int,
    check_lengths,
    check_no_overlap,
    check_rows,
    check_same_device,
    check_scalar,
    check_shape,
    check_tensor,
    define_op,
)
from ...dtypes import DCP_SCORES
from ...limits import TOPK_MAX_K
from . import reference
from .config import (
    LOCAL_INDEX_BITS,
    MAX_WORLD_SIZE,
    dcp_merge_local_topk,
    packed_row_words,
    rescue_row_slots,
)




def _check_dcp_scores(scores, lengths, world_size, rank, topk, max_length: int) -> None:
    check_tensor(scores, "scores", dtypes=DCP_SCORES, ndim=2, contiguous=False, inner_contiguous=True)
    check_rows(scores.shape[0], "scores")
    if scores.shape[1] > max_length:
        raise ValueError(f"scores may have at most {max_length} local tokens (columns), got {scores.shape[1]}")
    check_lengths(lengths, "lengths", scores.shape[0])
    check_same_device(scores, "scores", lengths=lengths)
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
    check_tensor(packed, "packed", dtypes=INT32, ndim=2)
    check_shape(packed, "packed", (rows, packed_row_words(local_topk)))
    check_tensor(rescue, "rescue", dtypes=INT32, ndim=2)
    check_shape(rescue, "rescue", (rows, packed_row_words(rescue_row_slots(topk))))
    check_same_device(scores, "scores", lengths=lengths, packed=packed, rescue=rescue)
    check_no_overlap({"packed": packed, "rescue": rescue}, {"scores": scores, "lengths": lengths})


define_op("dcp_pack", ("packed", "rescue"), check_dcp_pack, cuda=f"{__package__}.kernel")(reference.dcp_pack)


def _check_merge_outputs(rows, topk, reference_tensor, name, global_ids, local_ids, local_count, **inputs):
    check_rows(rows, name)
    check_tensor(global_ids, "global_ids", dtypes=INT32, ndim=2)
    check_shape(global_ids, "global_ids", (rows, topk))
    check_tensor(local_ids, "local_ids", dtypes=INT32, ndim=2)
    check_shape(local_ids, "local_ids", (rows, topk))
    check_tensor(local_count, "local_count", dtypes=INT32, ndim=1)
    check_shape(local_count, "local_count", (rows,))
    check_same_device(reference_tensor, name, global_ids=global_ids, local_ids=local_ids, local_count=local_count)
    check_no_overlap({"global_ids": global_ids, "local_ids": local_ids, "local_count": local_count},
                     {name: reference_tensor, **inputs})


def check_dcp_merge(gathered, rescue, topk, rank, global_ids, local_ids, local_count) -> None:
    check_tensor(gathered, "gathered", dtypes=INT32, ndim=3)
    world_size, rows, words = gathered.shape
    check_int(world_size, "gathered.shape[0] (world_size)", 2, MAX_WORLD_SIZE)
    check_int(topk, "topk", 1, TOPK_MAX_K)
    check_int(rank, "rank", 0, world_size - 1)
    local_topk = _one_round_local_topk(topk, world_size)
    check_shape(gathered, "gathered", (world_size, rows, packed_row_words(local_topk)))
    check_tensor(rescue, "rescue", dtypes=INT32, ndim=3)
    check_shape(rescue, "rescue", (world_size, rows, packed_row_words(rescue_row_slots(topk))))
    check_same_device(gathered, "gathered", rescue=rescue)
    _check_merge_outputs(rows, topk, gathered, "gathered", global_ids, local_ids, local_count, rescue=rescue)


define_op("dcp_merge", ("global_ids", "local_ids", "local_count"), check_dcp_merge, cuda=f"{__package__}.kernel")(
    reference.dcp_merge
)


def check_dcp_local_keys(scores, lengths, world_size, rank, topk, keys) -> None:
    # Global ids must fit the 32 bits of a merge key.
    _check_dcp_scores(scores, lengths, world_size, rank, topk, (1 << 31) // MAX_WORLD_SIZE)
    check_tensor(keys, "keys", dtypes=(torch.int64,), ndim=2)
    check_shape(keys, "keys", (scores.shape[0], topk))
    check_same_device(scores, "scores", lengths=lengths, keys=keys)
    check_no_overlap({"keys": keys}, {"scores": scores, "lengths": lengths})


define_op("dcp_local_keys", ("keys",), check_dcp_local_keys)(reference.dcp_local_keys)


def check_dcp_merge_generic(gathered_keys, rank, global_ids, local_ids, local_count) -> None:
    check_tensor(gathered_keys, "gathered_keys", dtypes=(torch.int64,), ndim=3)
    world_size, rows, topk = gathered_keys.shape
    check_int(world_size, "gathered_keys.shape[0] (world_size)", 1, MAX_WORLD_SIZE)
    check_int(topk, "gathered_keys.shape[2] (topk)", 1, TOPK_MAX_K)
    check_int(rank, "rank", 0, world_size - 1)
    _check_merge_outputs(rows, topk, gathered_keys, "gathered_keys", global_ids, local_ids, local_count)


define_op(
    "dcp_merge_generic", ("global_ids", "local_ids", "local_count"), check_dcp_merge_generic
)(reference.dcp_merge_generic)


def check_dcp_topk_merge(scores, lengths, topk, group_name, global_ids, local_ids, local_count) -> None:
    _check_dcp_scores(scores, lengths, 1, 0, topk, (1 << 31) // MAX_WORLD_SIZE)
    check_scalar(group_name, "group_name", str)
    _check_merge_outputs(scores.shape[0], topk, scores, "scores", global_ids, local_ids, local_count,
                         lengths=lengths)


define_op(
    "dcp_topk_merge", ("global_ids", "local_ids", "local_count"), check_dcp_topk_merge, cuda=f"{__package__}.kernel"
)(reference.dcp_topk_merge)
