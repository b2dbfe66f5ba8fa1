"""Programmatic dependent launch (PDL): one switch for every kernel of ours that follows another
kernel in a decode step.

A programmatic dependent's launch and setup overlap the tail of the kernel before it. Each of
ours waits for that kernel (``griddepcontrol.wait``) before its first read of anything it may
write and before its first global write, then lets its own dependents launch; after a plain
kernel the wait returns at once, so results never depend on what came before. Every path's GPU
tests and the fuzzer pass with it, and memcheck and racecheck are clean with it over every case
matrix.

What it buys depends on the kernel before, so the default is per op (``DEFAULT_ON``), from
``benchmarks/bench_pdl.py``: each op behind the kernel a runner has before it, in a CUDA graph.
On an H100, ``moe_route`` after cuBLAS's router GEMM took 0.6-1.1 us a step less with it and the
DCP pack 0.6-1.0 us less (its local select after the score GEMM, then the pack after our
select), so those two are on. The router front after torch's residual add took 0.15-0.29 us
more, and ``indexer_topk`` after the score GEMM 0.01-0.14 us more, so those stay plain.
``TORCH_SPARSE_DECODE_PDL=1`` makes every op a programmatic dependent (for a runner whose
kernels before ours let their dependents launch early, as ours do at their start);
``TORCH_SPARSE_DECODE_PDL=0`` makes none.

The kernels read ``enabled(op)`` at each launch (and the catalogs when they are built), so a test
or a benchmark flips ``ON`` in one place: True or False for every op, None for the defaults.
"""

from __future__ import annotations

import os

# The ops that take the switch.
ROUTE = "moe_route"
FRONT = "moe_gate_route"  # the router front and the split router GEMM
TOPK = "topk"  # the top-k engine, the short-row select and the block-key pass
DCP = "dcp"  # the DCP pack and its local select (ord16 keys)
DEFAULT_ON: frozenset[str] = frozenset({ROUTE, DCP})  # measured faster with it (above)

ON: bool | None = {"1": True, "0": False}.get(os.environ.get("TORCH_SPARSE_DECODE_PDL", ""))
# Triton's CPU interpreter (TRITON_INTERPRET=1, read once, as Triton reads it) has no grid
# dependencies and cannot run their instructions.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def enabled(op: str) -> bool:
    """Whether ``op``'s launches made now are programmatic dependents (never in the CPU interpreter)."""
    on = op in DEFAULT_ON if ON is None else ON
    return on and not INTERPRETED


def for_keys(ord16: bool) -> str:
    """The op a top-k launch serves: the DCP pack's local select (ord16 keys), else the top-k ops."""
    return DCP if ord16 else TOPK
