"""Every ``torch.ops.sparse_decode.*`` op, in a folder named for it (the DCP ops share ``dcp/``):
``reference.py`` (the exact pure-torch reference, also the CPU kernel), ``op.py`` (argument check,
registration and Python wrapper) and ``kernel.py`` (the CUDA kernel). Importing this registers
them all."""

from . import dcp, decode_row_lengths, indexer_topk, moe_route, select_candidate_blocks  # noqa: F401
