"""The dtypes each op takes, in one place: the argument checks, the kernels' type maps, the
warm-up loops, the catalogs and the tests read them here (``docs/developing.md``: adding a
score dtype)."""

from __future__ import annotations

import torch

# indexer_topk, select_candidate_blocks and their fused forms: scores or logits, widened to fp32
# exactly before they are ranked.
TOPK_SCORES = (torch.float32, torch.bfloat16, torch.float16)
# moe_route's scores or router logits (its bias and weights: fp32 or the scores' dtype).
ROUTER_SCORES = (torch.float32, torch.bfloat16, torch.float16)
# The DCP ops' local scores (ranked by their bf16 rounding).
DCP_SCORES = (torch.float32, torch.bfloat16)
# The block-key pass's keys: the top-k engine's source for block selection.
BLOCK_KEYS = torch.int32
# The score dtypes whose kernels the catalogs prebuild and warmup() loads (fp16 compiles on first use).
WARM_SCORES = (torch.float32, torch.bfloat16)


def cute_type(dtype: torch.dtype):
    """The CuTe DSL element type of a torch dtype (imports the DSL)."""
    import cutlass

    return {torch.float32: cutlass.Float32, torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            torch.int32: cutlass.Int32}[dtype]
