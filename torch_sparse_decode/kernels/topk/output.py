"""The output stage: each CTA writes its keys > t and its share of the keys == t at an offset
from the counts of the CTAs before it; ties at t go to the lowest ids, so ids come out ascending
with no sort. A fused build stages the kept ids and gathers the KV slots, raw ids and values
through ``Outputs`` once all are known. Nothing is written outside ``out`` (no workspace)."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Uint32

from .cluster import ballot_of, warp_offset
from .keys import KEY_NEG_INF, KEY_ZERO, key_score
from .layout import CAP, PER, THREADS, WARPS, Scratch
from .stream import Regs


class Outputs(NamedTuple):
    """Where a row's selected ids go: ``out``, through ``table`` when ``page`` > 0 (the KV slot
    ``table[row, id // page] * page + id % page``; blocks: page 1); with bit 1 of ``want`` the raw
    ids to ``raw`` too, with bit 2 the selected scores to ``values`` (token sources)."""

    out: cute.Tensor
    raw: cute.Tensor
    table: cute.Tensor
    page: Int32
    values: cute.Tensor
    want: Int32


class Staging(NamedTuple):
    """A fused build's kept ids on their way out: ``ids[e]`` and ``keys[e]`` are output slot
    ``base + e`` of the row (this CTA's slots start at ``base``), gathered through ``Outputs``
    once all are known. They are the copy's own arrays: the e-th kept key is never ahead of the
    copy's entry it came from, so compaction overwrites only entries it has read."""

    ids: cute.Tensor
    keys: cute.Tensor
    base: Int32


@cute.jit
def emit(o: Outputs, src: cute.Tensor, row: Int32, first: Int32, at: Int32, id: Int32, fused: cutlass.Constexpr[bool],
         pinned: cutlass.Constexpr[bool]):
    """Output slot ``at`` of the row: ``id`` (-1: padding, which maps to -1 and the value -inf)
    and, in a ``fused`` build, what ``o`` asks beside it (values: of token sources, not ``pinned``
    block keys). ``first``: the window's start in ``src``. For the short stretches (keep_all,
    padding; the short-row select's every id); the engine's kept ids go through ``flush``."""
    if cutlass.const_expr(not fused):
        o.out[row, at] = id
    else:
        mapped = id
        if (o.page > 0) & (id >= 0):
            mapped = o.table[row, id // o.page] * o.page + id % o.page
        o.out[row, at] = mapped
        if (o.want & 1) != 0:
            o.raw[row, at] = id
        if cutlass.const_expr(not pinned):
            if (o.want & 2) != 0:
                value = Float32(-Float32.inf).to(o.values.element_type)
                if id >= 0:
                    value = src[row, first + id]
                o.values[row, at] = value


class Output:
    """Writing the selected ids (a mixin of ``RadixTopk``: ``ctas``, ``pinned``, ``fused``)."""

    @cute.jit
    def compact_tile(self, regs: Regs, t: Uint32, take: Int32, eq_before: Int32, ranked, o: Outputs,
                     dest: Staging, row: Int32, written: Int32, counts: cute.Tensor, parity: Int32, tid: Int32):
        """Write the ids of a tile's keys > t and of the first ``take`` keys == t (``eq_before``
        of them came earlier) after the ``written`` before them, in index order: to ``o.out``, or
        in a fused build to ``dest``.
        Returns (kept, keys == t).

        Warps own contiguous parts of the tile, so a warp's offset is the sum of the lower warps'
        counts: one barrier per tile (two when the ties must be ranked). ``counts`` holds two
        tiles' (kept, tied) warp counts; tiles alternate ``parity`` so none waits for the reads."""
        keys, ids = regs.keys, regs.ids
        lane = tid % 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        kept_at = parity * 2 * WARPS
        tied_at = kept_at + WARPS
        tile_tied = Int32(0)
        eq_run = eq_before
        if ranked:
            tied_n = Int32(0)
            for i in cutlass.range_constexpr(PER):
                tied_n = tied_n + Int32(cute.arch.popc(ballot_of((keys[i] == t) & (keys[i] != Uint32(0)))))
            eq_run, tile_tied = warp_offset(counts, tied_n, tied_at, eq_before, tid)
        flags = cute.make_rmem_tensor(PER, Boolean)
        kept_n = Int32(0)
        for i in cutlass.range_constexpr(PER):
            tied = (keys[i] == t) & (keys[i] != Uint32(0))
            flags[i] = (keys[i] > t) | (tied & (eq_before < take))
            if ranked:
                ballot = ballot_of(tied)
                flags[i] = (keys[i] > t) | (tied & (eq_run + Int32(cute.arch.popc(ballot & lower)) < take))
                eq_run = eq_run + Int32(cute.arch.popc(ballot))
            kept_n = kept_n + Int32(cute.arch.popc(ballot_of(flags[i])))
        slot, added = warp_offset(counts, kept_n, kept_at, written, tid)
        ats = cute.make_rmem_tensor(PER, Int32)
        for i in cutlass.range_constexpr(PER):
            ballot = ballot_of(flags[i])
            ats[i] = slot + Int32(cute.arch.popc(ballot & lower))
            slot = slot + Int32(cute.arch.popc(ballot))
        width = o.out.shape[1]
        for i in cutlass.range_constexpr(PER):
            if cutlass.const_expr(self.fused):
                e = ats[i] - dest.base
                if flags[i] & (ats[i] < width) & (e < CAP):  # exact counts never fail these; memory-safe if not
                    dest.ids[e] = ids[i]
                    dest.keys[e] = keys[i]
            elif flags[i] & (ats[i] < width):
                o.out[row, ats[i]] = ids[i]
        return added, tile_tied

    @cute.jit
    def copy_out(self, o: Outputs, dest: Staging, sm: Scratch, row: Int32, at: Int32, done: Int32, n: Int32,
                 written: Int32, tid: Int32):
        """Write the copy's entries ``done``..``n`` (at ``buf[at + j]``, in index order) after the
        ``written`` before them. A fused build stages them in the same arrays, at or below the
        entries' own places: each batch is read before any of it is written."""
        width = o.out.shape[1]
        for start in range(done, n, THREADS):
            j = start + tid
            e = at + min(max(j, Int32(0)), n - 1)
            kid, key = sm.buf_id[e], sm.buf_key[e]
            cute.arch.sync_threads()
            slot = written + j - done
            if cutlass.const_expr(self.fused):
                if (j < n) & (slot < width) & (slot - dest.base < CAP):
                    dest.ids[slot - dest.base] = kid
                    dest.keys[slot - dest.base] = key
            elif (j < n) & (slot < width):
                o.out[row, slot] = kid
            cute.arch.sync_threads()

    @cute.jit
    def flush(self, o: Outputs, src: cute.Tensor, dest: Staging, row: Int32, first: Int32, count: Int32,
              tid: Int32):
        """A fused build's output: the ``count`` staged ids through ``o``. Each thread gathers its
        slots' entries at once, in a batch of 1, 2, 4 or 8 slots, the fewest that cover ``count``
        (a CTA keeps ~k / CTAs ids, so most threads have one slot or none); only the gathers that
        ``o`` asks for run."""
        slots = (count + THREADS - 1) // THREADS
        for n in cutlass.range_constexpr((CAP // THREADS).bit_length()):
            if (slots > ((1 << n) >> 1)) & (slots <= (1 << n)):
                self.flush_batch(o, src, dest, row, first, count, tid, 1 << n)

    @cute.jit
    def flush_batch(self, o: Outputs, src: cute.Tensor, dest: Staging, row: Int32, first: Int32, count: Int32,
                    tid: Int32, slots: cutlass.Constexpr[int]):
        """``flush`` with ``slots`` slots a thread. Slots past ``count`` gather id 0's entries
        (one cached line) so no load sits under a per-slot branch. Values come from the staged
        keys; only a key that two scores share (-inf / NaN, +0.0 / -0.0) reads the row again."""
        width = o.out.shape[1]
        last, end, per_page = o.table.shape[1] - 1, src.shape[1] - 1, max(o.page, Int32(1))
        staged = cute.make_rmem_tensor(slots, Int32)
        entries = cute.make_rmem_tensor(slots, Int32)
        picked = cute.make_rmem_tensor(slots, src.element_type)
        for j in cutlass.range_constexpr(slots):
            e = tid + j * THREADS
            # Clamped to the row: exact counts stage every slot below count; memory-safe if not.
            staged[j] = min(max(cutlass.select_(e < count, dest.ids[e], Int32(0)), Int32(0)), end)
            entries[j] = Int32(0)
        if o.page > 0:
            for j in cutlass.range_constexpr(slots):
                entries[j] = o.table[row, min(staged[j] // per_page, last)]
        if cutlass.const_expr(not self.pinned):
            if (o.want & 2) != 0:
                for j in cutlass.range_constexpr(slots):
                    key = dest.keys[tid + j * THREADS]
                    picked[j] = key_score(key).to(src.element_type)
                    if (key == Uint32(KEY_NEG_INF)) | (key == Uint32(KEY_ZERO)):
                        picked[j] = src[row, min(first + staged[j], end)]
        for j in cutlass.range_constexpr(slots):
            e = tid + j * THREADS
            at = dest.base + e
            if (e < count) & (at < width):
                id = staged[j]
                o.out[row, at] = cutlass.select_(o.page > 0, entries[j] * per_page + id % per_page, id)
                if (o.want & 1) != 0:
                    o.raw[row, at] = id
                if cutlass.const_expr(not self.pinned):
                    if (o.want & 2) != 0:
                        o.values[row, at] = picked[j]

    @cute.jit
    def emit(self, o: Outputs, src: cute.Tensor, row: Int32, first: Int32, at: Int32, id: Int32):
        """``emit`` of this build (fused or not, block keys or scores)."""
        emit(o, src, row, first, at, id, self.fused, self.pinned)

    @cute.jit
    def keep_all(self, o: Outputs, src: cute.Tensor, row: Int32, first: Int32, first_id: Int32, count: Int32,
                 rank: Int32, tid: Int32):
        """A row with nothing to select writes ids ``first_id .. first_id + count - 1`` then -1,
        whatever the keys hold: a row of <= k_sel keys (blocks: besides the pinned newest) keeps
        every valid id (first_id 0, count valid); with k_sel = 0 a pinned row keeps its newest
        block alone. No key is read; the cluster's CTAs write interleaved stretches."""
        for i in range(rank * THREADS + tid, o.out.shape[1], self.ctas * THREADS):
            self.emit(o, src, row, first, i, cutlass.select_(i < count, first_id + i, Int32(-1)))
