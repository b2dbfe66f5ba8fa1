"""The one-round DCP step on the GPU: the symmetric-memory workspace of a (group, topk) and the
step over it (select, push, wait, merge), the CUDA path of ``dcp_topk_merge``."""

from __future__ import annotations

import torch
import triton

from ...dtypes import DCP_SCORES
from ...kernels import pdl
from .config import LOCAL_INDEX_BITS, NO_WAIT, packed_row_words, rescue_row_slots, workspace_words
from .launch import MERGE_KERNEL, MergeLaunch, launch_merge, uses_cute
from .merge_triton import bitmap_words
from .pack import pack_kernel


class Workspace:
    """One DCP group's one-round state for one topk, built collectively by ``make_workspace``.

    This rank's symmetric buffer holds (int32 words, the same layout on every rank), each B' word
    as an 8-byte unit (the word, then the step's tag ``(seq & 0x7FFFFFFF) + 1``, stored at once):
    ``exchange [2 parities][W ranks][max_rows][2 * packed words]`` (peers push their packed rows
    here), ``rescue [2][max_rows][2 * rescue words]`` (this rank's local top-K, read by peers).
    A reader knows a unit of the step has arrived when it carries the step's tag (the buffer
    starts zeroed; a tag is never 0 and a parity's tag changes every other step). ``state`` (local
    int64) holds the step sequence, the rows merged so far this step, the error word (``error``)
    and when the step's first wait began (the step's waits end ``timeout_s`` after it). The
    kernels advance the sequence, so CUDA graph replays walk the parities too."""

    def __init__(self, group_name: str, buffer: torch.Tensor, buffers: list[int], world_size: int, rank: int,
                 topk: int, local_topk: int, max_rows: int, timeout_s: float, handle=None,
                 max_local_len: int = 1 << LOCAL_INDEX_BITS):
        """``buffers``: every rank's address of its buffer (``buffers[rank] == buffer.data_ptr()``)."""
        self.group_name, self.world_size, self.rank = group_name, world_size, rank
        self.topk, self.local_topk, self.max_rows = topk, local_topk, max_rows
        self.timeout_ns = int(timeout_s * 1e9)
        self.buffer, self.handle = buffer, handle
        # int32 words of a tagged packed / rescue row
        self.packed_words = 2 * packed_row_words(local_topk)
        self.rescue_words = 2 * packed_row_words(rescue_row_slots(topk))
        self.exchange_parity = world_size * max_rows * self.packed_words
        self.rescue_parity = max_rows * self.rescue_words
        self.rescue_offset = 2 * self.exchange_parity
        device = buffer.device
        self.peers = torch.tensor(buffers, dtype=torch.int64, device=device)
        self.state = torch.tensor([0, 0, 0, NO_WAIT], dtype=torch.int64, device=device)
        self.exchange = buffer[: self.rescue_offset]
        self.own_rows = buffer[rank * max_rows * self.packed_words:]
        self.rescue = buffer[self.rescue_offset:]
        # Per-step scratch, owned here so that a step allocates nothing: the local top-K ids, and
        # the Triton merge's bitmaps (the CuTe merge keeps its own in shared memory).
        self.ids = torch.empty(max_rows, topk, dtype=torch.int32, device=device)
        self.max_local_len = max_local_len  # the widest step that takes the one-round path
        self.bitmap_words = bitmap_words(world_size, max_local_len)
        self.scratch = None
        if not uses_cute(self.ids):
            self.triton_scratch()

    words = staticmethod(workspace_words)

    def triton_scratch(self) -> torch.Tensor:
        """The Triton merge's bitmaps (zero between steps), made on first use."""
        if self.scratch is None:
            self.scratch = torch.zeros(self.max_rows, 2 * self.bitmap_words, dtype=torch.int32,
                                       device=self.buffer.device)
        return self.scratch

    def take_error(self) -> int:
        """The error word since the last call, then cleared (host sync: call outside captured
        steps): bit r, rank r's rows did not arrive in time; bit 16 + r, rank r's step had
        another row count."""
        error = int(self.state[2].item()) & 0xFFFFFFFF
        if error:
            self.state[2] = 0
        return error


def make_workspace(group_name: str, world_size: int, rank: int, topk: int, local_topk: int, max_rows: int,
                   device: torch.device, timeout_s: float, max_local_len: int) -> Workspace:
    """Collective: allocate and rendezvous the symmetric buffer, zero it, and sync the group."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch.distributed.distributed_c10d import _resolve_process_group

    words = Workspace.words(world_size, topk, local_topk, max_rows)
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before rendezvous on older torch
        symm_mem.enable_symm_mem_for_group(group_name)
    buffer = symm_mem.empty(words, dtype=torch.int32, device=device)
    handle = symm_mem.rendezvous(buffer, group_name)
    buffer.zero_()
    torch.cuda.synchronize(device)
    dist.barrier(group=_resolve_process_group(group_name))
    # The tensor may start inside its symmetric allocation: the same offset on every rank.
    offset = buffer.data_ptr() - handle.buffer_ptrs[rank]
    buffers = [ptr + offset for ptr in handle.buffer_ptrs]
    return Workspace(group_name, buffer, buffers, world_size, rank, topk, local_topk, max_rows, timeout_s, handle,
                     max_local_len)


def one_round_step(ws: Workspace, scores: torch.Tensor, lengths: torch.Tensor, global_ids: torch.Tensor,
                   local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """Pack, push, wait, merge: the whole one-round step on this rank (rows <= ws.max_rows)."""
    rows = scores.shape[0]
    if rows == 0:
        return
    ids = ws.ids[:rows]
    local_topk_ids(scores, lengths, ids)
    push_rows(ws, ids, scores)
    merge_step(ws, global_ids, local_ids, local_count)


def local_topk_ids(scores: torch.Tensor, lengths: torch.Tensor, ids: torch.Tensor) -> None:
    """The rank's local top-K (``ids.shape[1]``) by bf16 ord16 (the CuTe engine), ids ascending, -1 padded."""
    from ...kernels.topk import select_ord16

    if scores.shape[1]:
        select_ord16(scores, lengths, ids.shape[1], ids)
    else:
        ids.fill_(-1)


def push_rows(ws: Workspace, ids: torch.Tensor, scores: torch.Tensor) -> None:
    """This rank's B' rows of the step from its local top-K ``ids`` into every rank's buffer."""
    slots, dependent = rescue_row_slots(ws.topk), pdl.enabled(pdl.DCP)
    pack_kernel[(ids.shape[0],)](
        ids, ids.stride(0), scores, scores.stride(0), ws.own_rows, ws.packed_words, ws.rescue, ws.rescue_words,
        ws.state, ws.peers, ws.rank, ws.rank * ws.max_rows * ws.packed_words, ws.exchange_parity, ws.rescue_parity,
        K=ws.topk, N=ws.local_topk, R=slots, SLOTS=max(triton.next_power_of_2(slots), 32), W=ws.world_size,
        EXCHANGE=True, EARLY_MERGE=uses_cute(ids), PDL=dependent, num_warps=8, launch_pdl=dependent,
    )


def merge_step(ws: Workspace, global_ids: torch.Tensor, local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """Wait for every rank's rows of the step, merge them, advance the step."""
    scratch = None if uses_cute(global_ids) else ws.triton_scratch()
    launch_merge(MergeLaunch(
        ws.world_size, ws.topk, ws.rank, ws.exchange, ws.max_rows * ws.packed_words, ws.packed_words, ws.peers,
        ws.rescue_offset, ws.rescue_words, global_ids, local_ids, local_count, ws.state, ws.exchange_parity,
        ws.rescue_parity, ws.timeout_ns, scratch, ws.bitmap_words))


def warm_step(world_size: int, topk: int) -> None:
    """Compile every kernel variant a one-round step of (W, K) can take, from fake tensors: the
    engine's ord16 selection at each cluster size and score dtype, and the step's merge. (The
    pack, one Triton variant per score dtype, compiles in ``init_dcp_topk_merge``'s warm steps.)"""
    from ...kernels import topk as engine
    from .merge import compiled

    for ctas in engine.CLUSTER_SIZES:
        for dtype in DCP_SCORES:
            engine.compiled(dtype, False, ctas, ord16=True)
    if MERGE_KERNEL == "cute":
        compiled(world_size, topk, True)
