"""The DCP ops (``dcp_pack``, ``dcp_merge``, ``dcp_local_keys``, ``dcp_merge_generic``,
``dcp_topk_merge``): their argument checks, registrations and Python wrappers (re-exported by
``torch_sparse_decode.dcp``, with the process-group entry points of ``group``).

Local position ``l`` on rank ``r`` of a W-rank group is global token ``l * W + r``. Every rank
scores its own tokens; every rank needs the same exact global top-K, ranked on bf16-rounded scores
(NaN as -inf, -0.0 as +0.0) with ties to the lower global id. Two paths, bit-identical by
construction (the same keys, the same order):

- one-round: each rank packs its best N candidates into a B' row, the group exchanges the rows
  once, and every rank merges them, replacing each saturated rank's row by its local top-K (its
  rescue row). On GPUs (``init_dcp_topk_merge`` returned N > 0 and the step fits its workspace)
  the whole step is the ``dcp_topk_merge`` op's CUDA kernel: pack, push into the peers'
  symmetric memory, bounded wait, merge reading rescue rows from the peers. As separate ops
  (``pack_candidates``, ``merge_packed``) it runs anywhere; on a CPU/gloo group
  ``dcp_topk_merge(..., local_topk=N)`` fetches the rescue rows with a second all-gather;
- generic: every rank exchanges its full local top-K as int64 keys and merges them.

``simulate_dcp_topk`` runs the one-round pack and merge of a W-rank group in one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

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
from .config import (LOCAL_INDEX_BITS, MAX_WORLD_SIZE, dcp_merge_local_topk, packed_row_words, rescue_row_slots,
                     step_timeout_s)
from .group import all_gather_rows, check_step, dcp_topk_merge_check, generic_step, process_group


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
)(generic_step)


# ------------------------------------------------------------------------------ the wrappers


def _shape(t: object, name: str, ndim: int) -> tuple[int, ...]:
    """``t``'s shape, once it is a tensor of ``ndim`` dimensions (before anything is allocated)."""
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        shown = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {ndim}-D tensor, got {shown}")
    return tuple(t.shape)


def _rows(t: object, name: str, ndim: int) -> int:
    """The rows of a [T, ...] (``ndim`` 2) or [W, T, ...] (``ndim`` 3) tensor argument."""
    return _shape(t, name, ndim)[ndim - 2]


def _group_ints(world_size, rank, topk) -> tuple[int, int, int]:
    world_size = check_int(world_size, "world_size", 1, MAX_WORLD_SIZE)
    return world_size, check_int(rank, "rank", 0, world_size - 1), check_int(topk, "topk", 1, TOPK_MAX_K)


def _merge_outputs(rows: int, topk: int, device: torch.device):
    return (
        torch.empty(rows, topk, dtype=torch.int32, device=device),
        torch.empty(rows, topk, dtype=torch.int32, device=device),
        torch.empty(rows, dtype=torch.int32, device=device),
    )


def pack_candidates(
    scores: torch.Tensor, lengths: torch.Tensor, world_size: int, rank: int, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's pack step: (packed [T, packed_row_words(N)], rescue [T, packed_row_words(K')]).

    ``scores`` fp32/bf16 [T, L] local indexer scores (L <= 2**17), ``lengths`` int32 [T] local
    valid lengths. ``packed`` holds the rank's best N = dcp_merge_local_topk(topk, world_size)
    candidates in the B' layout; ``rescue`` its local top-K in the same layout (K' = K rounded up
    to 32 slots), in the same key order. N must be > 0 (topk > 32, and at W = 2 not 43-64 or
    85-96, at W = 3 not 64: docs/dcp.md), else a ValueError names the generic merge.
    """
    world_size, rank, topk = _group_ints(world_size, rank, topk)
    rows = _rows(scores, "scores", 2)
    local_topk = dcp_merge_local_topk(topk, world_size)
    packed = torch.empty(rows, packed_row_words(local_topk), dtype=torch.int32, device=scores.device)
    rescue = torch.empty(rows, packed_row_words(rescue_row_slots(topk)), dtype=torch.int32, device=scores.device)
    torch.ops.sparse_decode.dcp_pack(scores, lengths, world_size, rank, topk, packed, rescue)
    return packed, rescue


def merge_packed(
    gathered: torch.Tensor, rescue: torch.Tensor, topk: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One-round merge on ``rank``: (global_ids [T, K], local_ids [T, K], local_count [T]).

    ``gathered`` int32 [W, T, words]: every rank's packed row; ``rescue`` int32 [W, T, words']:
    every rank's rescue row (only saturated ranks' rows are used). Ids ascending, -1 padded.
    """
    topk = check_int(topk, "topk", 1, TOPK_MAX_K)
    rank = check_int(rank, "rank", 0, MAX_WORLD_SIZE - 1)
    global_ids, local_ids, local_count = _merge_outputs(_rows(gathered, "gathered", 3), topk, gathered.device)
    torch.ops.sparse_decode.dcp_merge(gathered, rescue, topk, rank, global_ids, local_ids, local_count)
    return global_ids, local_ids, local_count


def local_topk_keys(
    scores: torch.Tensor, lengths: torch.Tensor, world_size: int, rank: int, topk: int
) -> torch.Tensor:
    """Generic path, one rank: its local top-K as int64 merge keys [T, K] (-1 = empty)."""
    world_size, rank, topk = _group_ints(world_size, rank, topk)
    keys = torch.empty(_rows(scores, "scores", 2), topk, dtype=torch.int64, device=scores.device)
    torch.ops.sparse_decode.dcp_local_keys(scores, lengths, world_size, rank, topk, keys)
    return keys


def merge_generic(gathered_keys: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Generic merge on ``rank`` of every rank's local top-K keys [W, T, K]."""
    rank = check_int(rank, "rank", 0, MAX_WORLD_SIZE - 1)
    _, rows, topk = _shape(gathered_keys, "gathered_keys", 3)
    global_ids, local_ids, local_count = _merge_outputs(rows, topk, gathered_keys.device)
    torch.ops.sparse_decode.dcp_merge_generic(gathered_keys, rank, global_ids, local_ids, local_count)
    return global_ids, local_ids, local_count


def simulate_dcp_topk(scores: torch.Tensor, lengths: torch.Tensor, topk: int, *, return_local: bool = False):
    """Run in one process exactly the pack and one-round merge that a W-rank group runs (a
    topk the one-round merge takes: ``pack_candidates``).

    Args:
        scores: [W, T, L] each rank's local scores; lengths: int32 [W, T] local valid lengths.
    Returns:
        global_ids int32 [T, topk] (rank 0's; every rank merges the same rows); with
        ``return_local`` also each rank's (local_ids [W, T, topk], local_count [W, T]).
    """
    topk = check_int(topk, "topk", 1, TOPK_MAX_K)
    if not isinstance(scores, torch.Tensor) or scores.dim() != 3:
        raise ValueError("scores must be a [W, T, L] tensor")
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != tuple(scores.shape[:2]):
        raise ValueError(f"lengths must be a [W, T] = {tuple(scores.shape[:2])} tensor")
    world_size = scores.shape[0]
    rows = [pack_candidates(scores[r], lengths[r], world_size, r, topk) for r in range(world_size)]
    gathered = torch.stack([p for p, _ in rows])
    rescue = torch.stack([q for _, q in rows])
    merged = [merge_packed(gathered, rescue, topk, r) for r in range(world_size)]
    if not return_local:
        return merged[0][0]
    return merged[0][0], torch.stack([m[1] for m in merged]), torch.stack([m[2] for m in merged])


def dcp_topk_merge(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    group=None,
    *,
    local_topk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full step on this rank of ``group``: (global_ids, local_ids, local_count).

    One op call (``torch.ops.sparse_decode.dcp_topk_merge``, the group by its name): it captures
    in CUDA graphs and traces under ``torch.compile``. On a group that ``init_dcp_topk_merge`` set
    up, steps of at most its ``max_rows`` rows and ``max_local_len`` local tokens take the
    one-round merge; every other step the generic merge, bit-identical.

    Every rank must call it with the same ``topk`` and row count. Each step's waits for its peers
    are bounded by the ``timeout_s`` given to ``init_dcp_topk_merge`` (default
    ``STEP_TIMEOUT_S``, 5 s):

    - one-round: the kernel stops waiting at the bound and writes no ids (-1, count 0) for the
      rows it lacks; a peer whose step has another row count is seen at once. Outside graph
      capture this call then raises (``dcp_topk_merge_check``), naming the ranks; in a captured
      step call ``dcp_topk_merge_check`` between replays.
    - generic (and the CPU path with ``local_topk``): outside graph capture the ranks first
      exchange (rows, topk) and raise the same ValueError on every rank when they differ; a wait
      past the bound raises ``DcpStepError``. In a captured step the bound is the process group's
      own timeout.

    A rank that arrives late after its peers gave up: on the one-round path it still gets the
    exact answer (its peers' rows were there) and the ranks that waited raise; on the generic
    path every rank raises (docs/dcp.md).

    Args:
        scores: this rank's local indexer scores, fp32/bf16 [T, L].
        lengths: int32 [T] local valid lengths.
        topk: K, the global selection size.
        group: the DCP process group (default: the world).
        local_topk: testing aid for CPU groups: N runs the one-round algorithm there, its rescue
            rows fetched by a second all-gather (standing in for the symmetric-memory read).
    """
    topk = check_int(topk, "topk", 1, TOPK_MAX_K)
    group = process_group(group, "dcp_topk_merge")
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if local_topk:
        if local_topk != dcp_merge_local_topk(topk, world_size):
            raise ValueError(f"local_topk must be 0 or dcp_merge_local_topk({topk}, {world_size}), got {local_topk}")
        timeout_s = step_timeout_s(group.group_name, topk)
        check_step(group, _rows(scores, "scores", 2), topk, timeout_s, scores.device)
        packed, rescue = pack_candidates(scores, lengths, world_size, rank, topk)
        gathered, rescued = (all_gather_rows(rows, group, timeout_s) for rows in (packed, rescue))
        return merge_packed(gathered, rescued, topk, rank)
    global_ids, local_ids, local_count = _merge_outputs(_rows(scores, "scores", 2), topk, scores.device)
    torch.ops.sparse_decode.dcp_topk_merge(scores, lengths, topk, group.group_name, global_ids, local_ids,
                                           local_count)
    if scores.is_cuda and not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing():
        dcp_topk_merge_check(group, topk)
    return global_ids, local_ids, local_count
