"""CUDA kernels of the DCP ops (``dcp_pack``, ``dcp_merge``, ``dcp_topk_merge``), over their parts:

- ``pack.py``: the Triton pack (a rank's B' rows; in a step also the push to its peers);
- ``launch.py``: the merge's one launch, on ``merge.py`` (the CuTe merge that ships, reading a
  step's rows through ``exchange.py``) or ``merge_triton.py`` (its Triton twin, which the CPU
  interpreter runs in CI);
- ``step.py``: the one-round step over a group's symmetric-memory workspace.

``dcp_topk_merge`` takes the one-round step where ``init_dcp_topk_merge`` built a workspace for
(group, topk) and the step fits it (a shape test, the same on every rank), else the generic step
(``group.generic_step``).
"""

from __future__ import annotations

import torch

from ...dtypes import DCP_SCORES
from .config import (BUILT_TOPK, BUILT_WORLD_SIZES, GROUPS, dcp_merge_local_topk, dcp_topk_merge_fits,
                     packed_row_words, rescue_row_slots)
from .group import generic_step
from .launch import MergeLaunch, launch_merge
from .pack import pack_rows
from .step import local_topk_ids, one_round_step


def merge_rows(gathered: torch.Tensor, peers: torch.Tensor, rescue_row_stride: int, topk: int, rank: int,
               global_ids: torch.Tensor, local_ids: torch.Tensor, local_count: torch.Tensor, **kernel) -> None:
    """One-round merge of ``gathered`` [W, T, words]; rank r's rescue rows start at ``peers[r]``
    (``kernel``: as ``launch_merge`` takes it)."""
    world_size, rows, _ = gathered.shape
    if rows:
        gathered = gathered.contiguous()
        launch_merge(MergeLaunch(world_size, topk, rank, gathered.view(-1), gathered.stride(0), gathered.stride(1),
                                 peers, 0, rescue_row_stride, global_ids, local_ids, local_count), **kernel)


def stacked_peers(rescue: torch.Tensor) -> torch.Tensor:
    """The address table of a stacked [W, T, words] rescue tensor (one rank per slice)."""
    step = rescue.stride(0) * rescue.element_size()
    return torch.arange(rescue.shape[0], dtype=torch.int64, device=rescue.device) * step + rescue.data_ptr()


def dcp_pack(scores, lengths, world_size, rank, topk, packed, rescue) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_pack`` (arguments already checked)."""
    ids = torch.empty(scores.shape[0], topk, dtype=torch.int32, device=scores.device)
    local_topk_ids(scores, lengths, ids)
    pack_rows(ids, scores, packed, rescue)


def dcp_merge(gathered, rescue, topk, rank, global_ids, local_ids, local_count) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_merge`` (arguments already checked)."""
    merge_rows(gathered, stacked_peers(rescue), rescue.stride(1), topk, rank, global_ids, local_ids, local_count)


def _pack_buffers(world_size: int, dtype: torch.dtype, device: torch.device):
    """A simulated group's one-row scores, lengths, packed rows and rescue rows at K = BUILT_TOPK."""
    width = 4096
    n = dcp_merge_local_topk(BUILT_TOPK, world_size)
    scores = torch.zeros(1, width, dtype=dtype, device=device)
    lengths = torch.full((1,), width, dtype=torch.int32, device=device)
    packed = torch.empty(world_size, 1, packed_row_words(n), dtype=torch.int32, device=device)
    rescue = torch.empty(world_size, 1, packed_row_words(rescue_row_slots(BUILT_TOPK)), dtype=torch.int32,
                         device=device)
    return scores, lengths, packed, rescue


def warm_triton(device: torch.device) -> None:
    """The simulated pack's Triton kernel for each built group size and score dtype, every rank
    (``kernels/triton_cache``). A group's one-round step compiles in ``init_dcp_topk_merge``."""
    ids = torch.arange(BUILT_TOPK, dtype=torch.int32, device=device).view(1, BUILT_TOPK)
    for world_size in BUILT_WORLD_SIZES:
        for dtype in DCP_SCORES:
            scores, _, packed, rescue = _pack_buffers(world_size, dtype, device)
            for rank in range(world_size):
                pack_rows(ids, scores, packed[rank], rescue[rank])


def warm(device: torch.device) -> None:
    """Run the simulated pack (its local select) and merge once at W = 2 (the kernels load from
    their catalogs, the pack's Triton kernel in ``warm_triton``)."""
    world_size = 2
    for dtype in DCP_SCORES:
        scores, lengths, packed, rescue = _pack_buffers(world_size, dtype, device)
        for rank in range(world_size):
            dcp_pack(scores, lengths, world_size, rank, BUILT_TOPK, packed[rank], rescue[rank])
        ids = torch.empty(2, 1, BUILT_TOPK, dtype=torch.int32, device=device)
        dcp_merge(packed, rescue, BUILT_TOPK, 0, ids[0], ids[1], torch.empty(1, dtype=torch.int32, device=device))


def dcp_topk_merge(scores, lengths, topk, group_name, global_ids, local_ids, local_count) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_topk_merge``: the one-round step where the group has
    a workspace and the step fits it (a shape test, the same on every rank), else the generic merge."""
    state = GROUPS.get((group_name, topk))
    ws = state.workspace if state is not None else None
    rows, width = scores.shape
    if ws is not None and dcp_topk_merge_fits(rows, topk, ws.local_topk, group_name) and width <= ws.max_local_len:
        one_round_step(ws, scores, lengths, global_ids, local_ids, local_count)
    else:
        generic_step(scores, lengths, topk, group_name, global_ids, local_ids, local_count)
