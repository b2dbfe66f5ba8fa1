"""Tile streaming: a CTA's span of a row passes through a shared-memory ring of STAGES tiles
(16-byte cp.async, any row alignment, nothing read past the valid prefix); each warp copies and
reads only its own contiguous part of every tile, so the pipeline needs warp syncs, not CTA
barriers. A span of at most STAGES tiles stays resident: later passes read the ring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from ..cute import copy_async16
from .keys import source_key
from .layout import PER, STAGES, TILE, WARP_SPAN


class Span(NamedTuple):
    """This CTA's part of the row: keys [lo, hi), streamed in ``tiles`` tiles from ``base``
    (16-byte aligned, up to a chunk before lo), the row at ``row_off`` elements."""

    row_off: Int64
    base: Int32
    lo: Int32
    hi: Int32
    tiles: Int32


@dataclass(frozen=True)
class Regs:
    """A thread's keys of the current tile and their ids (PER each)."""

    keys: cute.Tensor
    ids: cute.Tensor


class Streaming:
    """The engine's reads of its span (a mixin of ``RadixTopk``: ``source``, ``ord16``)."""

    @cute.jit
    def key_of(self, x) -> Uint32:
        return source_key(x, self.source, self.ord16)

    @cute.jit
    def fetch(self, src: cute.Tensor, ring: cute.Tensor, span: Span, j: Int32, tid: Int32):
        """Start copying this warp's part of tile j into its ring slot: 16-byte cp.async per
        chunk, nothing read at or past ``hi`` (zero-filled instead)."""
        row_off, base, lo, hi, tiles = span
        lane, warp = tid % 32, tid // 32
        size = self.source.width // 8
        vec = 16 // size
        slot = j % STAGES
        for c in cutlass.range_constexpr(WARP_SPAN // vec // 32):
            q = warp * WARP_SPAN + (c * 32 + lane) * vec
            first = base + j * TILE + q
            valid = min(max(hi - first, Int32(0)), Int32(vec))
            at = cutlass.select_(valid > 0, first, base)
            copy_async16(Int32((ring.iterator + (slot * TILE + q)).toint()),
                         Int64((src.iterator + (row_off + Int64(at))).toint()), valid * size)

    @cute.jit
    def begin_pass(self, src: cute.Tensor, ring: cute.Tensor, span: Span, refetch, tid: Int32):
        """Start a pass over the span's tiles: request the first STAGES - 1 (``refetch``), or find
        the whole span still in the ring from the first pass. Each warp copies and reads only its
        own part of every tile, so the pipeline needs warp syncs, never a CTA barrier."""
        row_off, base, lo, hi, tiles = span
        cute.arch.sync_warp()  # the warp is done with the ring's previous contents
        if refetch:
            for s in cutlass.range_constexpr(STAGES - 1):
                if s < tiles:
                    self.fetch(src, ring, span, Int32(s), tid)
                cute.arch.cp_async_commit_group()

    @cute.jit
    def next_tile(self, src: cute.Tensor, ring: cute.Tensor, span: Span, j: Int32, refetch, regs: Regs,
                  tid: Int32):
        """This thread's keys of tile j (0 outside [lo, hi)) and their ids; when streaming, wait
        for the tile and request the one STAGES - 1 ahead into the slot freed last iteration."""
        row_off, base, lo, hi, tiles = span
        lane, warp = tid % 32, tid // 32
        if refetch:
            cute.arch.cp_async_wait_group(STAGES - 2)
            cute.arch.sync_warp()
            if j + (STAGES - 1) < tiles:
                self.fetch(src, ring, span, j + (STAGES - 1), tid)
            cute.arch.cp_async_commit_group()
        keys, ids = regs.keys, regs.ids
        slot = j % STAGES
        for i in cutlass.range_constexpr(PER):
            q = warp * WARP_SPAN + i * 32 + lane
            keys[i] = self.key_of(ring[slot * TILE + q])
            ids[i] = base + j * TILE + q
        if (j == 0) | (j == tiles - 1):  # only the end tiles reach outside [lo, hi)
            for i in cutlass.range_constexpr(PER):
                keys[i] = Uint32(cutlass.select_((ids[i] >= lo) & (ids[i] < hi), keys[i], Uint32(0)))
