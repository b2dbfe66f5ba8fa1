"""The merge's one launch: ``MergeLaunch`` names what a merge reads and writes, ``launch_merge``
runs it on the CuTe merge (``merge.py``, what ships on CUDA tensors) or its Triton twin
(``merge_triton.py``, which the CPU interpreter runs in CI). ``dcp_merge`` (the simulated merge)
and a step's merge (``step.merge_step``) both launch through it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .config import dcp_merge_local_topk, rescue_row_slots
from .merge_triton import MERGE_WARPS, bitmap_words, merge_kernel

# The merge on CUDA tensors: "cute" (shipped) or "triton" (the twin); bench_dcp.py times both.
MERGE_KERNEL = "cute"


def uses_cute(t: torch.Tensor, kernel: str = MERGE_KERNEL) -> bool:
    """Whether the merge of rows on ``t``'s device is the CuTe kernel (CUDA), else the Triton one."""
    return t.is_cuda and kernel == "cute"


@dataclass
class MergeLaunch:
    """One merge of ``global_ids.shape[0]`` rows of a (``world_size``, ``topk``) group.

    Rank r's sent row of row t is at int32 word ``t * row_stride + r * rank_stride`` of
    ``gathered`` (a flat view), its rescue row at byte ``peers[r]`` + 4 * (``rescue_offset`` +
    ``t * rescue_row_stride``). A step's merge (``state`` given: the workspace's step counter,
    rows merged, error word and wait start) reads tagged units at the step's parity (``parity_*``
    words further on odd steps), waits at most ``timeout_ns`` and advances the step; a simulated
    merge (``state`` None) reads plain rows. ``scratch``: the Triton merge's zeroed bitmaps,
    [rows, 2 * ``bitmap_words``] (made here when None)."""

    world_size: int
    topk: int
    rank: int
    gathered: torch.Tensor
    rank_stride: int
    row_stride: int
    peers: torch.Tensor
    rescue_offset: int
    rescue_row_stride: int
    global_ids: torch.Tensor
    local_ids: torch.Tensor
    local_count: torch.Tensor
    state: torch.Tensor | None = None
    parity_gathered: int = 0
    parity_rescue: int = 0
    timeout_ns: int = 0
    scratch: torch.Tensor | None = None
    bitmap_words: int = 0

    def arguments(self) -> tuple:
        """The positional arguments of the CuTe merge, in its order (a simulated merge passes
        ``peers`` for the state it does not read)."""
        state = self.peers if self.state is None else self.state
        return (self.gathered, self.rank_stride, self.row_stride, self.peers, self.rescue_offset,
                self.rescue_row_stride, self.global_ids, self.local_ids, self.local_count, self.rank, state,
                self.parity_gathered, self.parity_rescue, self.timeout_ns)


def launch_merge(m: MergeLaunch, kernel: str = MERGE_KERNEL) -> None:
    """Run the merge ``m`` (rows > 0) on the CuTe kernel or its Triton twin (``uses_cute``)."""
    exchange = m.state is not None
    if uses_cute(m.global_ids, kernel):
        from .merge import compiled

        compiled(m.world_size, m.topk, exchange)(*m.arguments())
        return
    rows = m.global_ids.shape[0]
    words = m.bitmap_words or bitmap_words(m.world_size)
    scratch = m.scratch
    if scratch is None:
        scratch = torch.zeros(rows, 2 * words, dtype=torch.int32, device=m.global_ids.device)
    n = dcp_merge_local_topk(m.topk, m.world_size)
    merge_kernel[(rows,)](
        m.gathered, m.rank_stride, m.row_stride, m.peers, m.rescue_offset, m.rescue_row_stride, scratch,
        scratch.stride(0), m.global_ids, m.local_ids, m.global_ids.stride(0), m.local_count, m.topk, m.rank,
        m.peers if m.state is None else m.state, m.parity_gathered, m.parity_rescue, m.timeout_ns,
        W=m.world_size, WP2=triton.next_power_of_2(m.world_size), N=n, NP2=triton.next_power_of_2(n),
        R=rescue_row_slots(m.topk), KP2=triton.next_power_of_2(m.topk), WORDS=words, EXCHANGE=exchange,
        num_warps=MERGE_WARPS,
    )
