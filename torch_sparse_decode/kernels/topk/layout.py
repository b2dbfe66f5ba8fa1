"""The engine's sizes and its shared memory: one table of the CTA's arrays, which the kernel
allocates from and ``smem_bytes`` sizes (the test that checks it fits reads that)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ...dtypes import BLOCK_KEYS, TOPK_SCORES, cute_type

THREADS = 512
WARPS = THREADS // 32
PER = 16  # keys per thread per streamed tile
WARP_SPAN = 32 * PER  # a tile's keys per warp: warp w owns [w * WARP_SPAN, (w + 1) * WARP_SPAN)
TILE = THREADS * PER
BINS = 2048
FINE = BINS // THREADS  # bins per coarse bin of the digit search
CAP = 4096  # keys (and ids) a CTA can copy to shared memory after the first digit
MAX_CLUSTER = 8
CLUSTER_SIZES = (1, 2, 4, 8)  # every value cluster_size can return
SPAN_PER_CTA = 8192  # keys per CTA before a row takes more CTAs
STAGES = 4  # tiles in the shared-memory ring (STAGES - 1 in flight); shorter spans stay resident
# Spans of more keys than this (per CTA) take the one-read path. Two tiles: from three tiles up
# the gated copy beats the resident two passes (32 x 64K ord16: 24.5 -> 20.7 us), at one or two
# it does not (8 x 128K 16.9 -> 17.3, 1 x 64K ord16 13.7 -> 14.7; benchmarks/RESULTS.md).
ONE_READ_FROM = 2 * TILE
MAX_TILES = (1 << 20) // TILE + 1  # a span's tiles: widths <= 2**20, the first tile may start before it
NO_COPY = 0xFFFFFFFF  # count_digit's ``high`` when it copies nothing (no key is above it)
ID_BITS = 20  # ids < 2**20; the gated copy tags each with its part (< MAX_TILES * WARPS < 2**12) above them
SOURCES = {dtype: cute_type(dtype) for dtype in (*TOPK_SCORES, BLOCK_KEYS)}  # torch dtype -> the engine's source type
# Where a profiled build (RadixTopk(profile=True)) stamps the clock: the end of each phase, as
# cycles since the kernel began (0 for a phase the row did not take).
PHASES = ("first attempt failed", "gated pass + index order", "exchange", "digits from the copies",
          "first-digit pass", "digit 0", "copy pass", "digits 1-2", "offsets", "output", "padding + last barrier")
# Per CTA, after its phases: the global timer (ns, low 32 bits) at its start and its end, to see
# when CTAs run relative to each other (SM clocks are not synchronized across SMs).
PROFILE_SLOTS = len(PHASES) + 2
ALIGN = 16  # bytes: every array starts 16-byte aligned (16-byte loads and cp.async)


def shared_arrays(source) -> tuple:
    """A CTA's shared memory, in allocation order: (name, element type, elements). The ring last
    but two: the arrays before it keep their offsets (a shift of the ring by 16 bytes cost randn
    rows)."""
    return (
        ("hist", Int32, 3 * BINS),  # one histogram per digit, read by the other CTAs
        ("coarse", Int32, 3 * THREADS),  # per digit, the digit search's coarse bins, read remotely
        ("fine", Int32, FINE),
        ("counts", Int32, 4 * WARPS),  # compaction: 2 tiles x 2 counts
        ("warp_sums", Int32, WARPS),
        ("result", Int32, 2),
        ("shared", Int32, 4),  # read by the other CTAs
        ("claimed", Int32, 2),  # the gated pass's copy
        ("segments", Int32, MAX_TILES * WARPS),
        ("buf_key", Uint32, CAP),  # the copy of the keys at or above t's bucket
        ("buf_id", Int32, CAP),
        ("ring", source, STAGES * TILE),  # tiles of the row
        ("bounds", Uint32, 2),
        ("gate_ties", Int32, 1),  # keys == gate counted, read remotely
    )


def smem_bytes(source) -> int:
    """The bytes ``allocate`` takes for a ``source`` element type (each array aligned)."""
    total = 0
    for _, dtype, count in shared_arrays(source):
        total = -(-total // ALIGN) * ALIGN + count * dtype.width // 8
    return total


@dataclass(frozen=True)
class Scratch:
    """A CTA's shared memory (``shared_arrays``). ``hist``, ``coarse``, ``shared``, ``bounds``
    and ``gate_ties`` are read by the cluster's other CTAs; ``buf_key`` / ``buf_id`` hold the copy
    of the keys at or above the threshold's bucket."""

    hist: cute.Tensor  # one 2048-bin histogram per digit
    coarse: cute.Tensor  # per digit, THREADS coarse bins of the digit search
    fine: cute.Tensor  # the chosen coarse bin's fine bins
    counts: cute.Tensor  # compaction: two tiles' (kept, tied) warp counts
    warp_sums: cute.Tensor
    result: cute.Tensor  # the digit search's (digit, keys above)
    shared: cute.Tensor  # (keys above t, keys == t, copied, gate), read by the other CTAs
    claimed: cute.Tensor  # the gated pass's (copy size, keys == gate)
    segments: cute.Tensor  # the gated pass's (tile, warp) parts
    buf_key: cute.Tensor
    buf_id: cute.Tensor
    ring: cute.Tensor  # STAGES tiles of the row
    bounds: cute.Tensor  # (AND, OR) of the keys the digit-1 pass counted, read by the other CTAs
    gate_ties: cute.Tensor  # the gated pass's keys equal to its gate, counted, not copied


def allocate(source) -> Scratch:
    """The CTA's shared memory (called while the kernel is traced)."""
    smem = cutlass.memory.SmemAllocator()
    return Scratch(**{name: smem.allocate_tensor(dtype, cute.make_layout(count), ALIGN)
                      for name, dtype, count in shared_arrays(source)})
