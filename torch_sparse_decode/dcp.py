"""DCP decode top-k merge: the exact global top-K across decode-context-parallel ranks.

Local position ``l`` on rank ``r`` of a W-rank group is global token ``l * W + r``. Every rank
scores its own tokens; every rank needs the same exact global top-K, ranked on bf16-rounded scores
(NaN as -inf, -0.0 as +0.0) with ties to the lower global id.

Two paths, bit-identical by construction (the same keys, the same order):

- one-round: each rank packs its best N candidates into a B' row, the group exchanges the rows
  once, and every rank merges them, replacing each saturated rank's row by its local top-K (its
  rescue row). On GPUs (``init_dcp_topk_merge`` returned N > 0 and the step fits its workspace)
  the whole step is the ``dcp_topk_merge`` op's CUDA kernel: pack, push into the peers'
  symmetric memory, bounded wait, merge reading rescue rows from the peers.
  As separate ops (``pack_candidates``, ``merge_packed``) it runs anywhere; on a CPU/gloo group
  ``dcp_topk_merge(..., local_topk=N)`` fetches the rescue rows with a second all-gather;
- generic: every rank exchanges its full local top-K as int64 keys and merges them.

``simulate_dcp_topk`` runs the one-round pack and merge of a W-rank group in one process.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from ._library import check_int, check_scalar
from .dtypes import DCP_SCORES
from .limits import TOPK_MAX_K, TOPK_MAX_ROWS
from .ops.dcp.reference import DcpStepError, check_step
from .ops.dcp.reference import all_gather_rows as _all_gather
from .ops.dcp.config import (
    GROUPS,
    LOCAL_INDEX_BITS,
    MAX_WORLD_SIZE,
    STEP_TIMEOUT_S,
    DcpGroup,
    dcp_group,
    dcp_merge_local_topk,
    dcp_topk_merge_fits,
    dcp_topk_merge_max_rows,
    packed_row_words,
    rescue_row_slots,
    rescue_slots,
    step_timeout_s,
    workspace_words,
)

__all__ = [
    "MAX_WORLD_SIZE",
    "LOCAL_INDEX_BITS",
    "dcp_merge_local_topk",
    "packed_row_words",
    "rescue_slots",
    "rescue_row_slots",
    "dcp_topk_merge_max_rows",
    "dcp_topk_merge_fits",
    "pack_candidates",
    "merge_packed",
    "local_topk_keys",
    "merge_generic",
    "simulate_dcp_topk",
    "init_dcp_topk_merge",
    "dcp_topk_merge",
    "dcp_topk_merge_check",
    "DcpStepError",
    "STEP_TIMEOUT_S",
    "DcpGroup",
    "dcp_group",
]

log = logging.getLogger(__name__)


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


# -------------------------------------------------------------------------- process groups


def _group_device(group) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_support(group, topk: int, max_local_len: int | None) -> tuple[bool, str]:
    """Whether this rank alone could run the one-round merge, and why not."""
    world_size = dist.get_world_size(group)
    if world_size <= 1 or world_size > MAX_WORLD_SIZE:
        return False, f"world size {world_size} outside 2..{MAX_WORLD_SIZE}"
    if dcp_merge_local_topk(topk, world_size) == 0:
        return False, f"no one-round saving for topk={topk}, world size {world_size}"
    if max_local_len is not None and max_local_len > 1 << LOCAL_INDEX_BITS:
        return False, f"local lengths up to {max_local_len} exceed 2**{LOCAL_INDEX_BITS}"
    if _group_device(group).type != "cuda":
        return False, "not a CUDA (NCCL) group"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401

        from .ops.dcp import kernel  # noqa: F401  (triton)
    except ImportError as err:
        return False, f"symmetric memory or triton unavailable ({err})"
    device = torch.cuda.current_device()
    for other in range(torch.cuda.device_count()):
        if other != device and not torch.cuda.can_device_access_peer(device, other):
            return False, f"no peer access from cuda:{device} to cuda:{other}"
    return True, ""


# The one-round merge's kernels address the symmetric workspace with 32-bit word offsets.
MAX_WORKSPACE_WORDS = (1 << 31) - 1


def _argument_error(topk, max_rows, max_local_len, timeout_s, world_size: int) -> Exception | None:
    """What is wrong with this rank's arguments to ``init_dcp_topk_merge`` (a TypeError for a
    wrong type, else a ValueError), or None."""
    try:
        check_int(topk, "topk", 1, TOPK_MAX_K)
        max_rows = check_int(max_rows, "max_rows", 1, TOPK_MAX_ROWS)
        if max_local_len is not None:
            check_int(max_local_len, "max_local_len", 1, 1 << 62)
        check_scalar(timeout_s, "timeout_s", float)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    except (TypeError, ValueError) as err:
        return err
    local_topk = dcp_merge_local_topk(int(topk), world_size) if 1 <= world_size <= MAX_WORLD_SIZE else 0
    if local_topk:
        words = workspace_words(world_size, int(topk), local_topk, max_rows)
        if words > MAX_WORKSPACE_WORDS:
            most = MAX_WORKSPACE_WORDS // workspace_words(world_size, int(topk), local_topk, 1)
            return ValueError(f"max_rows must be at most {most} for topk={topk} on {world_size} ranks (the one-round "
                              f"workspace is addressed with 32-bit offsets), got {max_rows}")
    return None


def _process_group(group, caller: str):
    """``group``, or the default group for None; a TypeError naming it otherwise."""
    if group is None:
        if not dist.is_initialized():
            raise ValueError(f"{caller}: group is None and no default process group exists "
                             "(call torch.distributed.init_process_group first, or pass the group)")
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{caller}: group must be a torch.distributed.ProcessGroup (or None for the default group), "
                        f"got {type(group).__name__}")
    return group


def _agree(group, supported: bool, error: Exception | None = None, max_rows: int = 1,
           max_local_len: int | None = None, topk: int = 1) -> bool:
    """One all-reduce (MIN) over the group: the one-round merge only if every rank has it.

    It also carries each rank's argument check and the range of ``topk``, ``max_rows`` and
    ``max_local_len`` over the ranks, so that a bad or mismatched argument on any rank raises on
    every rank (naming it) instead of leaving the others waiting in a collective. (Mismatched
    sizes would also place the peers' pushes wrongly in the symmetric buffers.)"""
    length = -1 if max_local_len is None else max_local_len
    rows, k = (1, 1) if error else (max_rows, topk)
    mine = [int(supported and not error), int(not error), rows, -rows, length, -length, k, -k]
    reduced = torch.tensor(mine, dtype=torch.int64, device=_group_device(group))
    dist.all_reduce(reduced, op=dist.ReduceOp.MIN, group=group)
    everyone, valid, rows_lo, rows_hi, length_lo, length_hi, k_lo, k_hi = reduced.tolist()
    if error:
        raise error
    if not valid:
        raise ValueError("init_dcp_topk_merge: another rank of the group got invalid arguments (its error names them)")
    if k_lo != -k_hi:
        raise ValueError(f"topk must be the same on every rank of the group, got {k_lo} to {-k_hi}")
    if rows_lo != -rows_hi:
        raise ValueError(f"max_rows must be the same on every rank of the group, got {rows_lo} to {-rows_hi}")
    if length_lo != -length_hi:
        shown = ["None" if v < 0 else str(v) for v in (length_lo, -length_hi)]
        raise ValueError(f"max_local_len must be the same on every rank of the group, got {shown[0]} and {shown[1]}")
    return bool(everyone)


def init_dcp_topk_merge(group, topk: int, max_rows: int, *, max_local_len: int | None = None,
                        timeout_s: float = STEP_TIMEOUT_S) -> int:
    """Set up the one-round merge for ``group``; return its N, or 0 to keep the generic merge.

    Collective: every rank calls it, in the same order, with the same arguments, before any CUDA
    graph capture. The ranks agree with one all-reduce: an invalid or mismatched argument on any
    rank raises ValueError on every rank, naming it; if any rank cannot have the one-round merge
    (W = 1 or > 16, not a CUDA group, no peer access, ``max_local_len`` beyond 2**17), every rank
    returns 0: fail closed, never lossy. Then the symmetric-memory workspace for ``max_rows`` rows
    is allocated and rendezvoused (a failure there is fatal, as for any collective), every kernel
    variant a step can take is compiled, and steps run to prove the exchange. Steps of up to
    ``max_rows`` rows and ``max_local_len`` local tokens (default 2**17) take the one-round merge.

    ``timeout_s`` bounds each later step's waits for its peers, on either path (see
    ``dcp_topk_merge``). Calling it again for the same group and topk with the same arguments
    returns the agreed value; with others it raises.
    """
    group = _process_group(group, "init_dcp_topk_merge")
    name = group.group_name
    world_size = dist.get_world_size(group)
    error = _argument_error(topk, max_rows, max_local_len, timeout_s, world_size)
    if not error:  # numpy numbers key the same entries as Python's
        topk, max_rows, timeout_s = int(topk), int(max_rows), float(timeout_s)
        max_local_len = None if max_local_len is None else int(max_local_len)
    arguments = (max_rows, max_local_len, timeout_s)
    done = GROUPS.get((name, topk)) if not error else None
    if done is not None:  # local: a repeated call runs no collective
        if done.arguments != arguments:
            raise ValueError(f"init_dcp_topk_merge was already called for group {name!r} and topk={topk} with "
                             f"(max_rows, max_local_len, timeout_s) = {done.arguments}; got {arguments}")
        return done.local_topk
    supported, why = False, error
    if not error:
        try:  # a rank that raised here would leave its peers waiting in the agreement
            supported, why = _local_support(group, topk, max_local_len)
        except Exception as err:
            supported, why = False, f"support check failed: {type(err).__name__}: {err}"
    agreed = _agree(group, supported, error, max_rows, max_local_len, topk)
    local_topk = dcp_merge_local_topk(topk, world_size) if agreed else 0
    state = DcpGroup(name, topk, local_topk, max_rows, max_local_len, timeout_s)
    if local_topk:
        from .ops.dcp import kernel, step

        device = torch.device("cuda", torch.cuda.current_device())
        state.workspace = step.make_workspace(
            name, world_size, dist.get_rank(group), topk, local_topk, max_rows, device, timeout_s,
            max_local_len or 1 << LOCAL_INDEX_BITS)
    GROUPS[(name, topk)] = state  # before the warm steps, which take the one-round path
    if local_topk:
        kernel.warm_step(world_size, topk)  # no compile may happen inside a graph capture
        # Steps in lockstep on every rank, both score dtypes: they prove the exchange.
        for dtype in DCP_SCORES:
            warm = torch.zeros(1, 64, dtype=dtype, device=device)
            dcp_topk_merge(warm, torch.full((1,), 64, dtype=torch.int32, device=device), topk, group)
    else:
        log.info("DCP top-k merge: generic path (%s)", why if not supported else "a peer lacks support")
    return local_topk


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
    group = _process_group(group, "dcp_topk_merge")
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if local_topk:
        if local_topk != dcp_merge_local_topk(topk, world_size):
            raise ValueError(f"local_topk must be 0 or dcp_merge_local_topk({topk}, {world_size}), got {local_topk}")
        timeout_s = step_timeout_s(group.group_name, topk)
        check_step(group, _rows(scores, "scores", 2), topk, timeout_s, scores.device)
        packed, rescue = pack_candidates(scores, lengths, world_size, rank, topk)
        return merge_packed(_all_gather(packed, group, timeout_s), _all_gather(rescue, group, timeout_s), topk, rank)
    global_ids, local_ids, local_count = _merge_outputs(_rows(scores, "scores", 2), topk, scores.device)
    torch.ops.sparse_decode.dcp_topk_merge(scores, lengths, topk, group.group_name, global_ids, local_ids,
                                           local_count)
    if scores.is_cuda and not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing():
        dcp_topk_merge_check(group, topk)
    return global_ids, local_ids, local_count


def _ranks(bits: int) -> str:
    return ", ".join(str(r) for r in range(MAX_WORLD_SIZE) if bits >> r & 1)


def dcp_topk_merge_check(group=None, topk: int | None = None) -> None:
    """Raise ``DcpStepError`` if a one-round step of ``group`` since the last check lacked a peer's
    rows, naming the ranks (reads device memory: call it between decode steps, outside graph
    capture). The error is reported once."""
    group = _process_group(group, "dcp_topk_merge_check")
    for (name, k), state in GROUPS.items():
        ws = state.workspace
        if ws is None or name != group.group_name or (topk is not None and k != topk):
            continue
        error = ws.take_error()
        if error:
            why = []
            if error & 0xFFFF:
                why.append(f"rank(s) {_ranks(error & 0xFFFF)} did not send their rows within {ws.timeout_ns / 1e9:g} s "
                           "(stalled, never called, or called with another topk)")
            if error >> 16:
                why.append(f"rank(s) {_ranks(error >> 16)} sent a step with another row count")
            raise DcpStepError(f"dcp_topk_merge (group {name}, topk {k}, rank {ws.rank}): {'; '.join(why)}; the "
                              "affected rows returned no ids")
