"""torch_sparse_decode: exact, CUDA-graph-safe custom ops for sparse-attention MoE decode.

Ops (``torch.ops.sparse_decode.*``, each with a Python wrapper here):

- ``moe_route``: MoE routing, top-k experts by score + bias with exact tie rules;
  ``moe_gate_route``: the router front, the router GEMM to fp32 logits and their routing;
- ``select_candidate_blocks``: candidate block selection over the valid prefix of decode rows;
  ``select_candidate_blocks_fused``: the same, its block ids mapped through a block table;
- ``indexer_topk``: exact token top-k of the DSA indexer; ``indexer_topk_fused``: the same, its
  output stage also writing KV slots through a page table, the raw ids and the values;
- ``decode_row_lengths``: the valid length of each query row of an MTP / next_n decode step;
- ``dcp``: the decode-context-parallel top-K merge (pack, one-round merge with rescue, generic
  merge, process-group entry points and its config helpers).

Every selection follows one order (``order``): NaN as -inf, -0.0 as +0.0, larger score first,
then the lower id.
"""

from __future__ import annotations

import torch

from . import dcp, ops, order  # noqa: F401  (ops registers every op)
from ._library import register_warmup, registered_ops, run_warmups
from .ops.decode_row_lengths.op import decode_row_lengths
from .ops.indexer_topk.op import indexer_topk
from .ops.indexer_topk_fused.op import FusedTopk, indexer_topk_fused
from .ops.moe_gate_route.op import moe_gate_route, moe_gate_route_check
from .ops.moe_route.op import moe_route
from .ops.select_candidate_blocks.op import select_candidate_blocks
from .ops.select_candidate_blocks_fused.op import select_candidate_blocks_fused

__version__ = "0.1.0"

__all__ = [
    "moe_route",
    "moe_gate_route",
    "moe_gate_route_check",
    "select_candidate_blocks",
    "select_candidate_blocks_fused",
    "indexer_topk",
    "indexer_topk_fused",
    "FusedTopk",
    "decode_row_lengths",
    "dcp",
    "ops",
    "order",
    "warmup",
    "registered_ops",
    "__version__",
]


@register_warmup
def _run_every_op(device: torch.device) -> None:
    """Run each op once at the demo's small shapes: loads kernels and fills the caching allocator.

    No process group is created, joined or used (a collective here would hang unless every rank
    called warmup): the full DCP step over a group warms in ``init_dcp_topk_merge``."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(8, 896, generator=gen).to(device)
    moe_route(scores, torch.zeros(896, device=device), 16, scale=2.5)
    hidden, gate = torch.randn(8, 7168, generator=gen).bfloat16(), torch.randn(896, 7168, generator=gen).bfloat16()
    for tokens in (4, 8):  # the front, and the GEMM path (cuBLAS's handle is made outside any capture)
        moe_gate_route(hidden[:tokens].to(device), gate.to(device), torch.zeros(896, device=device), 16, scale=2.5)
    logits = torch.randn(4, 1 << 17, generator=gen).to(device)
    ends = torch.tensor([1 << 17, 9000, 64, 0], dtype=torch.int32, device=device)
    select_candidate_blocks(logits, ends, 64, 2048)
    indexer_topk(logits, ends, 2048)
    pages = torch.arange(4 * 2048, dtype=torch.int32, device=device).view(4, 2048)  # pages of 64
    indexer_topk_fused(logits, ends, 2048, page_table=pages, page_size=64, ids=True, values=True)
    select_candidate_blocks_fused(logits, ends, 64, 2048, pages, ids=True)
    decode_row_lengths(ends, 2)
    world, local = 4, torch.randn(4, 4, 16384, generator=gen).to(device)
    lengths = torch.full((world, 4), 16384, dtype=torch.int32, device=device)
    dcp.simulate_dcp_topk(local, lengths, 2048)
    keys = torch.stack([dcp.local_topk_keys(local[r], lengths[r], world, r, 2048) for r in range(world)])
    dcp.merge_generic(keys, 0)


def warmup(device: torch.device | str | None = None) -> int:
    """Load every kernel and run each op once on ``device`` (default: the current CUDA device,
    else CPU). Returns the warm-up hooks run.

    Call it after model construction and before CUDA graph capture: compilation allocates, syncs
    and loads modules, none of which may happen inside a capture. On a GPU it loads each CuTe DSL
    kernel's catalog (``build_kernels``) from the disk cache ($TORCH_SPARSE_DECODE_CACHE, where a
    serving image puts the kernels it built ahead of time) and compiles what is missing there
    first, in parallel over the cores ($TORCH_SPARSE_DECODE_COMPILE_JOBS processes).
    """
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        from .build_kernels import warm_catalogs

        with torch.cuda.device(device):
            warm_catalogs(device)
    count = run_warmups(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count
