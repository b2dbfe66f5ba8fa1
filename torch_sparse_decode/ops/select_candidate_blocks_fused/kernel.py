"""The CUDA kernel of ``select_candidate_blocks_fused``: the block-key pass, then the engine, its
output stage mapping each block id through the block table as it writes it (no extra launch)."""

from __future__ import annotations

from ...kernels import topk as engine
from ..select_candidate_blocks.kernel import block_keys


def select_candidate_blocks_fused(logits, lengths, block_size, k, out, ids, block_table, row_starts=None) -> None:
    """The CUDA kernel of ``sparse_decode::select_candidate_blocks_fused`` (arguments already checked)."""
    keys = block_keys(logits, lengths, block_size, keep_all=k if k > 1 else 1 << engine.ID_BITS, starts=row_starts)
    engine.select(keys, lengths, logits.shape[1], block_size, k - 1, out, pinned=True, starts=row_starts,
                  table=block_table, page=1, raw=ids)
