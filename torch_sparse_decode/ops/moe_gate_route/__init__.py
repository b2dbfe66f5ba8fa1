"""``moe_gate_route``: reference, registration and wrapper (``op``), CUDA path (``kernel``)."""

from . import op  # noqa: F401  (registers the op)
