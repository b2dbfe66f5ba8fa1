"""``select_candidate_blocks_fused``: reference, registration and wrapper (``op``), CUDA kernel
(``kernel``)."""

from . import op  # noqa: F401  (registers the op)
