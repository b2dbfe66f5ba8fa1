"""Programmatic dependent launch (PDL): one switch for every kernel of ours that follows another
kernel in a decode step.

``TORCH_SPARSE_DECODE_PDL=1``: those kernels launch as programmatic dependents of the kernel
before them, so their launch and setup overlap its tail. Each waits for it
(``griddepcontrol.wait``) before its first read of anything that kernel may write, then lets its
own dependents launch; after a plain kernel the wait returns at once, so results never depend on
what came before. On the H200, 0.6-0.7 us a ``moe_route`` call less behind the router GEMM
(docs/ops.md). Opt-in until compute-sanitizer has run every case matrix with it: the routing,
front, DCP and short-row matrices are clean with it, the engine's and block keys' not yet run.

The kernels read ``enabled()`` at each launch (and the catalogs when they are built), so a test
or a benchmark flips ``ON`` in one place.
"""

from __future__ import annotations

import os

ON = os.environ.get("TORCH_SPARSE_DECODE_PDL", "0") == "1"
# Triton's CPU interpreter (TRITON_INTERPRET=1, read once, as Triton reads it) has no grid
# dependencies and cannot run their instructions.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def enabled() -> bool:
    """Whether launches made now are programmatic dependents (never in the CPU interpreter)."""
    return ON and not INTERPRETED
