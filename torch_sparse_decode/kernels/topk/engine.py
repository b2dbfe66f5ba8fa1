"""The engine's kernel, ``RadixTopk``, one build per static configuration, and its catalog."""

from __future__ import annotations

from typing import NamedTuple

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32

from ...dtypes import DCP_SCORES
from .. import pdl
from ..compile import cached_kernel, fake_stream, fake_tensor
from ..cute import begin_marks, block_exclusive, stamp, zero_fill
from .cluster import cluster_sync, load_rank
from .digits import DigitSearch
from .keys import DIGITS
from .layout import (BINS, CAP, CLUSTER_SIZES, FINE, NO_COPY, ONE_READ_FROM, PER, PHASES, PROFILE_SLOTS, SOURCES,
                     STAGES, THREADS, TILE, WARP_SPAN, WARPS, Scratch, allocate)
from .one_read import OneRead
from .output import Output, Outputs, Staging
from .stream import Regs, Span, Streaming


class Threshold(NamedTuple):
    """What the digit search leaves a CTA: t, the k_sel-th largest key of the row; ``take``, how
    many keys equal to t the best k_sel hold; the CTA's keys > t and == t; ``kept``, the entries
    of its copy (> CAP: none); ``above_only``, whether the copy holds its keys > t alone (not those
    == t); ``high_n``, the tie path's copy of the keys above t's first-digit bucket (-1: none);
    and whether a pass must stream the span again (``refetch``)."""

    t: Uint32
    take: Int32
    mine_above: Int32
    mine_tied: Int32
    kept: Int32
    above_only: Int32
    high_n: Int32
    refetch: Boolean


class Offsets(NamedTuple):
    """Where a CTA's ids go: after ``out_base`` of the CTAs before it (``out_total`` in the row);
    the keys == t before it (``eq_before``), how many ids it writes, and whether its ties need
    ranks in index order (some of them are left out)."""

    out_base: Int32
    out_total: Int32
    eq_before: Int32
    mine_taken: Int32
    ranked: Boolean


class RadixTopk(Streaming, DigitSearch, OneRead, Output):
    """The engine for one static configuration: source dtype, pinned id or not, cluster size,
    whether float scores are keyed by their bf16 ord16 (the DCP pack) instead of their full bits,
    and whether the output stage reads ``Outputs``' runtime fields (``fused``) or writes ids alone."""

    def __init__(self, source, pinned: bool, ctas: int, ord16: bool = False, profile: bool = False,
                 fused: bool = False, pdl: bool = False):
        self.source, self.pinned, self.ctas, self.ord16, self.fused = source, pinned, ctas, ord16, fused
        self.pdl = pdl  # a programmatic dependent of the kernel before (kernels/pdl.py)
        assert not (ord16 and fused), "a fused build decodes values from full-bit keys"
        self.profile = profile  # phase marks (benchmarks/profile_topk.py); compiled out otherwise

    @cute.jit
    def mark(self, marks: cute.Tensor, phase: cutlass.Constexpr[str]):
        """With ``profile``: the SM clock at the end of the phase named (PHASES; "start": the
        kernel's start)."""
        stamp(marks, PHASES, phase, self.profile)

    @cute.jit
    def __call__(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
                 block: Int32, k_sel: Int32, out: cute.Tensor, raw: cute.Tensor, table: cute.Tensor, page: Int32,
                 values: cute.Tensor, want: Int32, stream):
        self.kernel(src, lengths, starts, windowed, cols, block, k_sel, out, raw, table, page, values, want).launch(
            grid=[self.ctas, out.shape[0], 1], block=[THREADS, 1, 1], cluster=[self.ctas, 1, 1],
            stream=stream, use_pdl=self.pinned or self.pdl,
        )

    @cute.jit
    def wait_for_keys(self):
        """Block keys: the engine is launched as a programmatic dependent of the block-key pre-pass
        (its launch and setup overlap the pre-pass), so it waits for the pre-pass here (with
        ``pdl`` it has waited at its start)."""
        if cutlass.const_expr(self.pinned and not self.pdl):
            cute.arch.griddepcontrol_wait()

    @cute.kernel
    def kernel(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
               block: Int32, k_sel: Int32, out: cute.Tensor, raw: cute.Tensor, table: cute.Tensor, page: Int32,
               values: cute.Tensor, want: Int32):
        tid, _, _ = cute.arch.thread_idx()
        lane, warp = tid % 32, tid // 32
        rank, row, _ = cute.arch.block_idx()
        sm = allocate(self.source)
        regs = Regs(cute.make_rmem_tensor(PER, Uint32), cute.make_rmem_tensor(PER, Int32))
        marks = cute.make_rmem_tensor(len(PHASES) + 1, Int64)
        began = Int64(0)
        if cutlass.const_expr(self.profile):
            began = cute.arch.globaltimer()  # ns, the same clock on every SM
        begin_marks(marks, PHASES, self.profile)
        if cutlass.const_expr(self.pdl):  # the lengths, starts and scores may come from the kernel before
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()  # they wait for all of this grid in their own wait
        first, valid, n, per_cta, span = self.row_span(src, lengths, starts, windowed, cols, block, row, rank)
        o = Outputs(out, raw, table, page, values, want)
        if (n <= k_sel) | (k_sel == 0):
            # Nothing to select: every valid id, or (k_sel = 0, blocks' k = 1) the pinned one alone.
            first_id, count = Int32(0), valid
            if k_sel == 0:
                first_id, count = valid - 1, Int32(1 if self.pinned else 0)
            self.keep_all(o, src, row, first, first_id, count, rank, tid)
            self.wait_for_keys()  # never finish before the pre-pass (it reads the caller's tensors)
        else:
            self.wait_for_keys()
            # 1. The k_sel-th largest key t of the row, and how its keys fall among the CTAs.
            found = Threshold(*self.threshold(src, sm, span, n, per_cta, k_sel, regs, marks, tid))
            self.mark(marks, "digits 1-2")
            # 2. Output offsets: CTAs write in rank order; ties at t go to the lowest ids.
            place = Offsets(*self.offsets(sm, found, rank, tid))
            self.mark(marks, "offsets")
            # 3. The kept ids, in index order: from the copy when there is one, else from the row.
            self.write_kept(o, src, sm, span, row, first, found, place, regs, lane, warp, tid)
            self.mark(marks, "output")
            if rank == self.ctas - 1:
                self.pad(o, src, row, first, valid, place.out_total, tid)
            cute.arch.cp_async_wait_group(0)  # tiles requested before the output stopped early
            cluster_sync(self.ctas)  # no CTA leaves while others may read its shared memory
        if cutlass.const_expr(self.profile):  # after the ids: out[row, k_sel + 1 + rank * PROFILE_SLOTS ...]
            self.mark(marks, "padding + last barrier")
            self.write_marks(out, marks, began, row, rank, k_sel, tid)

    @cute.jit
    def row_span(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
                 block: Int32, row: Int32, rank: Int32):
        """(first, valid, n, per_cta, span): the row's window of columns [first, end) (first = 0
        unless ``windowed``; ids count from first), its valid keys (blocks: all valid blocks but
        the pinned newest: n), the keys per CTA and this CTA's span."""
        end = max(min(lengths[row], cols), Int32(0))
        first = cutlass.select_(windowed != 0, min(max(starts[row], Int32(0)), end), Int32(0))
        valid = (end - first + block - 1) // block
        n = valid
        if cutlass.const_expr(self.pinned):
            n = max(valid - 1, Int32(0))
        per_cta = (n + self.ctas - 1) // self.ctas
        lo = min(rank * per_cta, n)
        hi = min(lo + per_cta, n)
        # Tiles start 16-byte aligned in memory (cp.async), up to one chunk before lo.
        size = self.source.width // 8
        row_off = Int64(row) * src.stride[0]
        if cutlass.const_expr(not self.pinned):  # block keys already hold the window's blocks from 0
            row_off = row_off + Int64(first)
        base = lo - Int32((Int64((src.iterator + row_off).toint()) // size + Int64(lo)) % (16 // size))
        tiles = cutlass.select_(hi > lo, (hi - base + TILE - 1) // TILE, Int32(0))
        return first, valid, n, per_cta, Span(row_off, base, lo, hi, tiles)

    @cute.jit
    def threshold(self, src: cute.Tensor, sm: Scratch, span: Span, n: Int32, per_cta: Int32, k_sel: Int32,
                  regs: Regs, marks: cute.Tensor, tid: Int32):
        """The fields of ``Threshold``: the k_sel-th largest key t of the row, one 11/11/10-bit
        digit at a time, histograms summed over the cluster; by one read of long spans where that
        works, else by two passes."""
        refetch = Boolean(True)  # False once the first pass has left the whole span in the ring
        t = Uint32(0)
        take = Int32(0)
        mine_above = span.hi - span.lo
        mine_tied = Int32(0)
        kept = Int32(0)
        zero_fill(sm.hist, 3 * BINS, tid, THREADS)
        if tid == 0:
            sm.claimed[0] = Int32(0)
            sm.claimed[1] = Int32(0)
            sm.bounds[0] = Uint32(0xFFFFFFFF)
            sm.bounds[1] = Uint32(0)
        cute.arch.sync_threads()
        found = Int32(0)
        above_only = Int32(0)
        high_n = Int32(-1)
        # One read of long spans: copy the keys above a guessed gate in the first pass and
        # select from the copies alone. Exact when every CTA's gate is <= t (then the copies
        # hold every key >= t), which the end checks; else the two-pass path below.
        share = Int32((Int64(k_sel) * Int64(per_cta) + Int64(n - 1)) // Int64(n))
        target = min(2 * share, Int32(CAP * 3 // 4))
        if (per_cta > ONE_READ_FROM) & (4 * target >= 5 * share):
            kept, t, take, mine_above, mine_tied, found, above_only = self.read_once(
                src, sm, span, k_sel, target, regs, marks, tid, kept, t, take, mine_above, mine_tied, found, above_only)
            refetch = Boolean(True)
        if found == 0:
            refetch, t, mine_above, kept, high_n, take, mine_tied = self.two_passes(
                src, sm, span, k_sel, regs, marks, tid, t, refetch, high_n)
        return t, take, mine_above, mine_tied, kept, above_only, high_n, refetch

    @cute.jit
    def two_passes(self, src: cute.Tensor, sm: Scratch, span: Span, k_sel: Int32, regs: Regs, marks: cute.Tensor,
                   tid: Int32, t: Uint32, refetch, high_n: Int32):
        """(refetch, t, mine_above, kept, high_n, take, mine_tied) by two passes over the span."""
        hist, fine, claimed, bounds, warp_sums, ring, tiles = (sm.hist, sm.fine, sm.claimed, sm.bounds, sm.warp_sums,
                                                               sm.ring, span.tiles)
        # Two passes: histogram the first digit over the span; then a CTA whose keys at or
        # above t's bucket fit in shared memory copies them there (in index order),
        # counting the second digit on the way, and never passes over the span again.
        self.count_digit(src, sm, span, refetch, 0, t, regs, tid)
        self.mark(marks, "first-digit pass")
        refetch = tiles > STAGES
        digit, above, above_part = self.find_digit(sm, Int32(0), k_sel, tid)
        t = Uint32(digit) << Uint32(DIGITS[0][0])
        _, mine_above = block_exclusive(above_part, warp_sums, tid, WARPS)
        if tid == 0:
            claimed[0] = Int32(0)  # for the high copy
        cute.arch.sync_threads()  # warp_sums is reused next
        kept = mine_above + hist[digit]
        self.mark(marks, "digit 0")
        bucket = fine[digit % FINE]  # its keys in the cluster (the digit search leaves them in `fine`)
        if kept <= CAP:
            written = Int32(0)
            self.begin_pass(src, ring, span, refetch, tid)
            for tile in range(tiles):
                self.next_tile(src, ring, span, tile, refetch, regs, tid)
                written = written + self.copy_tile(regs, t, sm, written, tile % 2, tid)
            if tid == 0:  # the copy keeps no AND / OR: never settle on them
                bounds[0] = Uint32(0)
                bounds[1] = Uint32(0xFFFFFFFF)
        else:
            # Tie-heavy: also copy the keys above the bucket (<= k_sel of them, when there
            # are any: the copy costs the pass time), where the ring is free to order them
            # (a span streamed, not resident).
            if cutlass.const_expr(not self.ord16):
                if refetch & (digit < BINS - 1) & (mine_above > 0):
                    high_n = mine_above
            high = Uint32(NO_COPY)
            if high_n > 0:
                high = Uint32(digit + 1) << Uint32(DIGITS[0][0])
            self.count_digit(src, sm, span, refetch, 1, t, regs, tid, high)
            if high_n > 0:
                cute.arch.cp_async_wait_group(0)
                self.in_index_order(tiles, sm, high_n, tid, CAP - high_n)
        cute.arch.sync_threads()
        self.mark(marks, "copy pass")
        t, take, mine_above, mine_tied = self.digits_from_copy(1, sm, kept, t, k_sel - above, above_part, tid,
                                                               src, span, refetch, regs, bucket)
        return refetch, t, mine_above, kept, high_n, take, mine_tied

    @cute.jit
    def offsets(self, sm: Scratch, found, rank: Int32, tid: Int32):
        """The fields of ``Offsets``, from every CTA's keys > t and == t."""
        shared, take, mine_above, mine_tied = sm.shared, found.take, found.mine_above, found.mine_tied
        if tid == 0:
            shared[0] = mine_above
            shared[1] = mine_tied
        cluster_sync(self.ctas)
        eq_run = Int32(0)
        eq_before = Int32(0)
        out_base = Int32(0)
        out_total = Int32(0)
        mine_taken = Int32(0)
        above_r = cute.make_rmem_tensor(self.ctas, Int32)
        tied_r = cute.make_rmem_tensor(self.ctas, Int32)
        for r in cutlass.range_constexpr(self.ctas):  # every remote load in flight before the sums
            above_r[r] = load_rank(shared, Int32(0), r)
            tied_r[r] = load_rank(shared, Int32(1), r)
        for r in cutlass.range_constexpr(self.ctas):
            eq_r = tied_r[r]
            taken = above_r[r] + min(max(take - eq_run, Int32(0)), eq_r)
            if r < rank:
                out_base = out_base + taken
            if r == rank:
                eq_before = eq_run
                mine_taken = taken
            out_total = out_total + taken
            eq_run = eq_run + eq_r
        # Ties need ranks in index order only when some of them are left out.
        ranked = (eq_before < take) & (eq_before + mine_tied > take)
        return out_base, out_total, eq_before, mine_taken, ranked

    @cute.jit
    def write_kept(self, o: Outputs, src: cute.Tensor, sm: Scratch, span: Span, row: Int32, first: Int32, found,
                   place, regs: Regs, lane: Int32, warp: Int32, tid: Int32):
        """This CTA's kept ids in index order at its offset: from the copy when it holds them, else
        streamed from the row until the CTA's share is out."""
        keys, ids, counts, buf_id, buf_key, ring = regs.keys, regs.ids, sm.counts, sm.buf_id, sm.buf_key, sm.ring
        t, take, kept, above_only, high_n = found.t, found.take, found.kept, found.above_only, found.high_n
        mine_above, mine_tied, refetch, tiles = found.mine_above, found.mine_tied, found.refetch, span.tiles
        out_base, eq_before, mine_taken, ranked = place.out_base, place.eq_before, place.mine_taken, place.ranked
        written = out_base
        dest = Staging(buf_id, buf_key, out_base)  # a fused build's kept ids and keys (<= k)
        if (kept <= CAP) & (above_only == 0):
            for start in range(0, kept, TILE):
                for i in cutlass.range_constexpr(PER):
                    j = start + warp * WARP_SPAN + i * 32 + lane
                    at = min(j, Int32(CAP - 1))  # loads under a branch would not overlap
                    keys[i] = Uint32(cutlass.select_(j < kept, buf_key[at], Uint32(0)))
                    ids[i] = buf_id[at]
                added, tied = self.compact_tile(regs, t, take, eq_before, ranked, o, dest, row, written, counts,
                                                start // TILE % 2, tid)
                written = written + added
                eq_before = eq_before + tied
        else:
            # Until this CTA's share is out: where ties at t fill it from the lowest ids
            # (all-equal or few-valued rows) that is the first tiles, or none. When a copy
            # (the high copy, or the gated one without the keys at its gate) holds every key
            # > t of the span, only until its ties are out (ranked, to count them), then the
            # rest of the copy.
            copy_at, copy_n = CAP - high_n, high_n
            if above_only != 0:
                copy_at, copy_n = Int32(0), kept
                if cutlass.const_expr(self.fused):  # staged ids fill from 0: the copy moves clear
                    self.to_end(sm, kept, tid)
                    copy_at = CAP - kept
            from_copy = Int32((above_only != 0) | ((high_n >= 0) & (high_n == mine_above)))
            ranked = (from_copy != 0) | ranked
            ties_from = min(eq_before, take)
            ties_to = min(eq_before + mine_tied, take)
            streams = (mine_taken > 0) & ((from_copy == 0) | (ties_from < ties_to))
            self.begin_pass(src, ring, span, refetch & streams, tid)  # no requests that none reads
            for tile in range(tiles):
                if (written - out_base < mine_taken) & ((from_copy == 0) | (eq_before < ties_to)):
                    self.next_tile(src, ring, span, tile, refetch, regs, tid)
                    added, tied = self.compact_tile(regs, t, take, eq_before, ranked, o, dest, row, written,
                                                    counts, tile % 2, tid)
                    written = written + added
                    eq_before = eq_before + tied
            if from_copy != 0:
                done = written - out_base - (min(eq_before, take) - ties_from)  # the copy's entries out
                self.copy_out(o, dest, sm, row, copy_at, done, copy_n, written, tid)
        if cutlass.const_expr(self.fused):
            cute.arch.sync_threads()
            self.flush(o, src, dest, row, first, mine_taken, tid)

    @cute.jit
    def pad(self, o: Outputs, src: cute.Tensor, row: Int32, first: Int32, valid: Int32, out_total: Int32,
            tid: Int32):
        """The last CTA's part: the pinned newest block after the selected ids, then -1 padding."""
        out = o.out
        pad_from = out_total
        if cutlass.const_expr(self.pinned):
            if valid > 0:
                if (tid == 0) & (out_total < out.shape[1]):
                    self.emit(o, src, row, first, out_total, valid - 1)
                pad_from = out_total + 1
        for i in range(pad_from + tid, out.shape[1], THREADS):
            self.emit(o, src, row, first, i, Int32(-1))

    @cute.jit
    def write_marks(self, out: cute.Tensor, marks: cute.Tensor, began: Int64, row: Int32, rank: Int32,
                    k_sel: Int32, tid: Int32):
        """A profiled build: each phase's cycles and the CTA's start and end on the global timer,
        after the row's ids (out[row, k_sel + 1 + rank * PROFILE_SLOTS ...])."""
        ended = cute.arch.globaltimer()
        if tid == 0:
            at = k_sel + 1 + rank * PROFILE_SLOTS
            for phase in cutlass.range_constexpr(len(PHASES)):
                out[row, at + phase] = Int32(marks[phase + 1] - marks[0])
            out[row, at + len(PHASES)] = Int32(began & Int64(0xFFFFFFFF))
            out[row, at + len(PHASES) + 1] = Int32(ended & Int64(0xFFFFFFFF))


def catalog(target) -> list[tuple]:
    """Every configuration the ops can take (k and the sizes are runtime values): block keys with
    the pinned block, scores by their full bits and by their bf16 ord16 (the DCP pack), each
    source with and without the fused outputs, at every cluster size; launched as programmatic
    dependents where ``pdl.enabled`` says so for the op each serves."""
    configs, topk, dcp = [], pdl.enabled(pdl.TOPK), pdl.enabled(pdl.DCP)
    for ctas in CLUSTER_SIZES:
        for source in SOURCES:
            for fused in (False, True):
                configs.append((source, source is torch.int32, ctas, False, False, fused, topk))
        for source in DCP_SCORES:
            configs.append((source, False, ctas, True, False, False, dcp))
    return configs


@cached_kernel("topk_engine", catalog)
def compiled(source: torch.dtype, pinned: bool, ctas: int, ord16: bool = False, profile: bool = False,
             fused: bool = False, pdl: bool = False):
    """The engine at one (source dtype, pinned, cluster size, ord16 keys, profile marks, fused
    outputs, programmatic dependent launch), from fake tensors (no GPU needed)."""
    rows, width = cute.sym_int(), cute.sym_int()
    dtype = SOURCES[source]
    src = fake_tensor(dtype, (rows, width), (cute.sym_int64(), 1))
    lengths = fake_tensor(Int32, (rows,), (1,))
    starts = fake_tensor(Int32, (rows,), (1,))
    out, raw, table = (fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1)) for _ in range(3))
    values = fake_tensor(dtype, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1))
    engine = RadixTopk(dtype, pinned, ctas, ord16, profile, fused, pdl)
    return cute.compile(engine, src, lengths, starts, Int32(0), Int32(0), Int32(1), Int32(1), out, raw, table,
                        Int32(0), values, Int32(0), fake_stream(), options="--enable-tvm-ffi")
