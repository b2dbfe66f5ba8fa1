"""Every ``torch.ops.sparse_decode.*`` op, in a folder named for it (the DCP ops share ``dcp/``):
``reference.py`` (the exact pure-torch reference, also the CPU kernel), ``op.py`` (argument check,
registration and Python wrapper) and ``kernel.py`` (the CUDA kernel). Importing this registers
them all."""

from . import (  # noqa: F401
    dcp,
    decode_row_lengths,
    indexer_topk,
    indexer_topk_fused,
    moe_gate_route,
    moe_route,
    select_candidate_blocks,
    select_candidate_blocks_fused,
)
