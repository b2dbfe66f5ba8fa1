"""Programmatic dependent launch (PDL): one switch for every kernel of ours that follows another
kernel in a decode step.

``TORCH_SPARSE_DECODE_PDL=1``: those kernels launch as programmatic dependents of the kernel
before them, so their launch and setup overlap its tail. Each waits for it
(``griddepcontrol.wait``) before its first read of anything that kernel may write and before its
first global write, then lets its own dependents launch; after a plain kernel the wait returns at
once, so results never depend on what came before. Every path's GPU tests and the fuzzer pass with
it, and memcheck and racecheck are clean with it over every case matrix.

Opt-in, because what it buys depends on the kernel before. Behind a kernel that lets its
dependents launch early (ours do, at their start) it saves time: 0.6-0.7 us a ``moe_route``
call after another (H200), 0.63 us a DCP pack step, where the pack follows our local select
(H100). Behind one that does not (cuBLAS's router GEMM, torch's residual add) the step took longer
with it (benchmarks/bench_pdl.py, H100): +0.41-0.46 us for ``moe_route`` after the router GEMM,
+0.18-0.23 us for the router front after the residual add. A runner whose kernels before ours
trigger their dependents (FlashInfer's and TensorRT-LLM's PDL kernels) turns it on.

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
