"""The DCP ops: constants and sizes (``config``), pure-torch references (``reference``), the
process-group side (``group``), checks, registrations and wrappers (``op``), and CUDA kernels
(``kernel`` over ``pack``, ``step``, and the merge's ``launch`` of ``merge`` / ``merge_triton``).
Their public face is ``torch_sparse_decode.dcp``."""

from . import op  # noqa: F401  (registers the ops)
