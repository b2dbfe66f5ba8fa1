"""The DCP ops: constants and sizes (``config``), references, registrations (``op``) and CUDA
kernels (``kernel`` over ``pack``, ``merge``, ``merge_triton`` and ``step``). Their public entry
points are ``torch_sparse_decode.dcp``."""

from . import op  # noqa: F401  (registers the ops)
