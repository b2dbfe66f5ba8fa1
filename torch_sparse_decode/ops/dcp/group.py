"""The DCP ops' process-group side: setting a group up (``init_dcp_topk_merge``: the ranks'
agreement, the one-round workspace), the step's checks and collectives, the generic step (the
``dcp_topk_merge`` op on any backend), ``dcp_topk_merge_check`` and ``DcpStepError``.

Every collective here is bounded or agreed: a bad or mismatched argument on any rank raises on
every rank, and a step's waits end at the group's ``timeout_s``.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist

from ..._library import check_int, check_scalar
from ...dtypes import DCP_SCORES
from ...limits import TOPK_MAX_K, TOPK_MAX_ROWS
from . import reference
from .config import (GROUPS, LOCAL_INDEX_BITS, MAX_WORKSPACE_WORDS, MAX_WORLD_SIZE, STEP_TIMEOUT_S, DcpGroup,
                     dcp_merge_local_topk, step_timeout_s, workspace_words)

log = logging.getLogger(__name__)


class DcpStepError(RuntimeError):
    """A DCP step lacked a peer's rows: its wait ran past the step's bound (``init_dcp_topk_merge``'s
    ``timeout_s``), or a peer's step had another row count."""


def process_group(group, caller: str):
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


# ------------------------------------------------------------------------------ a step's collectives

# torch >= 2.13 renames all_gather_into_tensor (and deprecates the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def all_gather_rows(tensor: torch.Tensor, group, timeout_s: float | None = None) -> torch.Tensor:
    """[W, *tensor.shape]: every rank's ``tensor`` (rank order), one collective. With
    ``timeout_s`` (outside graph capture) the host waits at most that long, then raises."""
    world_size = dist.get_world_size(group)
    # Stacked along dim 0, the layout every backend (gloo included) accepts.
    out = tensor.new_empty((world_size * tensor.shape[0],) + tuple(tensor.shape[1:]))
    if timeout_s is None or _capturing():
        _all_gather_single(out, tensor.contiguous(), group=group)
    else:
        work = _all_gather_single(out, tensor.contiguous(), group=group, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise DcpStepError(f"the exchange did not complete within {timeout_s:g} s: a rank of the group stalled, "
                               f"never called, or called with another topk or row count ({err})") from None
    return out.view((world_size,) + tuple(tensor.shape))


def check_step(group, rows: int, topk: int, timeout_s: float, device: torch.device) -> None:
    """Before a step's exchange (outside graph capture): every rank's (rows, topk), gathered with
    the step's bound, must be this rank's. A mismatch raises the same ValueError on every rank; a
    late rank, ``DcpStepError``."""
    if _capturing():  # the shapes were fixed, and checked, before capture
        return
    every = all_gather_rows(torch.tensor([[rows, topk]], dtype=torch.int64, device=device), group, timeout_s)
    every = every.view(-1, 2).tolist()
    if any(pair != every[0] for pair in every):
        shown = ", ".join(f"rank {r}: {t} rows, topk={k}" for r, (t, k) in enumerate(every))
        raise ValueError(f"dcp_topk_merge: the ranks of the group disagree on the step ({shown})")


def generic_step(scores: torch.Tensor, lengths: torch.Tensor, topk: int, group_name: str, global_ids: torch.Tensor,
                 local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """The full DCP step on this rank, generic merge (the ``dcp_topk_merge`` op on any backend, and
    on CUDA where the one-round step does not apply): all-gather every rank's local top-K keys over
    the process group named ``group_name``, then merge them. Outside graph capture the ranks first
    check that they agree on the step, and each wait is bounded."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    timeout_s = step_timeout_s(group_name, topk)
    check_step(group, scores.shape[0], topk, timeout_s, scores.device)
    keys = torch.empty(scores.shape[0], topk, dtype=torch.int64, device=scores.device)
    reference.dcp_local_keys(scores, lengths, world_size, rank, topk, keys)
    reference.dcp_merge_generic(all_gather_rows(keys, group, timeout_s), rank, global_ids, local_ids, local_count)


# ------------------------------------------------------------------------------ setting a group up


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

        from . import step  # noqa: F401  (triton and the CuTe DSL)
    except ImportError as err:
        return False, f"symmetric memory, triton or the CuTe DSL unavailable ({err})"
    device = torch.cuda.current_device()
    for other in range(torch.cuda.device_count()):
        if other != device and not torch.cuda.can_device_access_peer(device, other):
            return False, f"no peer access from cuda:{device} to cuda:{other}"
    return True, ""


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


def _warm_step(group, topk: int, dtype: torch.dtype) -> None:
    """One step of one row, in lockstep on every rank: it proves the exchange."""
    device = torch.device("cuda", torch.cuda.current_device())
    lengths = torch.full((1,), 64, dtype=torch.int32, device=device)
    outputs = [torch.empty(1, topk, dtype=torch.int32, device=device) for _ in range(2)]
    count = torch.empty(1, dtype=torch.int32, device=device)
    scores = torch.zeros(1, 64, dtype=dtype, device=device)
    torch.ops.sparse_decode.dcp_topk_merge(scores, lengths, topk, group.group_name, *outputs, count)
    dcp_topk_merge_check(group, topk)


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
    group = process_group(group, "init_dcp_topk_merge")
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
        from . import step

        state.workspace = step.make_workspace(
            name, world_size, dist.get_rank(group), topk, local_topk, max_rows,
            torch.device("cuda", torch.cuda.current_device()), timeout_s, max_local_len or 1 << LOCAL_INDEX_BITS)
    GROUPS[(name, topk)] = state  # before the warm steps, which take the one-round path
    if local_topk:
        step.warm_step(world_size, topk)  # no compile may happen inside a graph capture
        for dtype in DCP_SCORES:
            _warm_step(group, topk, dtype)
    else:
        log.info("DCP top-k merge: generic path (%s)", why if not supported else "a peer lacks support")
    return local_topk


def _ranks(bits: int) -> str:
    return ", ".join(str(r) for r in range(MAX_WORLD_SIZE) if bits >> r & 1)


def dcp_topk_merge_check(group=None, topk: int | None = None) -> None:
    """Raise ``DcpStepError`` if a one-round step of ``group`` since the last check lacked a peer's
    rows, naming the ranks (reads device memory: call it between decode steps, outside graph
    capture). The error is reported once."""
    group = process_group(group, "dcp_topk_merge_check")
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
