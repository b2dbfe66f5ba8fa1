"""The CUDA kernel of ``indexer_topk_fused``: the top-k engine over the scores, its output stage
writing the KV slots, the raw ids and the values as it writes the ids (no extra launch)."""

from __future__ import annotations

from ...kernels import topk as engine


def indexer_topk_fused(scores, lengths, k, out, ids, values, page_table, page_size, row_starts=None) -> None:
    """The CUDA kernel of ``sparse_decode::indexer_topk_fused`` (arguments already checked)."""
    engine.select(scores, lengths, scores.shape[1], 1, k, out, pinned=False, starts=row_starts, table=page_table,
                  page=page_size, raw=ids, values=values)
