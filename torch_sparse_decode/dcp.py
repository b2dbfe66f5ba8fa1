"""DCP decode top-k merge: the exact global top-K across decode-context-parallel ranks.

The public face of ``ops/dcp/``: the wrappers of its ops (``ops/dcp/op.py``, whose docstring
describes the two paths), the process-group entry points (``ops/dcp/group.py``) and the sizes a
model asks for before any kernel exists (``ops/dcp/config.py``).
"""

from __future__ import annotations

from .ops.dcp.config import (
    LOCAL_INDEX_BITS,
    MAX_WORLD_SIZE,
    STEP_TIMEOUT_S,
    DcpGroup,
    dcp_group,
    dcp_merge_local_topk,
    dcp_topk_merge_fits,
    dcp_topk_merge_max_rows,
    max_saturated_ranks,
    packed_row_words,
    rescue_row_slots,
)
from .ops.dcp.group import DcpStepError, dcp_topk_merge_check, init_dcp_topk_merge
from .ops.dcp.op import (
    dcp_topk_merge,
    local_topk_keys,
    merge_generic,
    merge_packed,
    pack_candidates,
    simulate_dcp_topk,
)

__all__ = [
    "MAX_WORLD_SIZE",
    "LOCAL_INDEX_BITS",
    "dcp_merge_local_topk",
    "packed_row_words",
    "max_saturated_ranks",
    "rescue_row_slots",
    "dcp_topk_merge_max_rows",
    "dcp_topk_merge_fits",
    "pack_candidates",
    "merge_packed",
    "local_topk_keys",
    "merge_generic",
    "simulate_dcp_topk",
    "init_dcp_topk_merge",
    "dcp_topk_merge",
    "dcp_topk_merge_check",
    "DcpStepError",
    "STEP_TIMEOUT_S",
    "DcpGroup",
    "dcp_group",
]
