"""The exact top-k engine behind ``select_candidate_blocks``, ``indexer_topk`` and the DCP pack's
local select (CuTe DSL).

The engine (``RadixTopk``, CuTe DSL) writes the ids of the best ``k_sel`` of each row's first
``n`` keys, ascending, -1 padded, optionally followed by a pinned id (the newest block).

- Keys are 32-bit, unsigned order = library order (NaN as -inf, -0.0 as +0.0); ids break ties.
  A row is split over a thread-block cluster of S CTAs (S = 1..8 by row width and row count),
  each owning a contiguous span of the row's valid prefix (work follows the valid length).
- The k_sel-th largest key t is found one radix digit at a time (11, 11 and 10 bits): every CTA
  histograms its span's keys that match the digits found so far (shared-memory atomics), and the
  digit is read off the cluster's summed histogram through distributed shared memory, in two
  rounds of few remote loads (512 coarse bins, then the chosen one's fine bins). Every CTA also
  learns how many of its own keys are above t and equal to t.
- A span streams through a shared-memory ring of STAGES tiles (16-byte cp.async, any row
  alignment, nothing read past the valid prefix); each warp copies and reads only its own
  contiguous part of every tile, so the pipeline needs warp syncs, not CTA barriers. A span of
  <= STAGES tiles stays resident: later passes read shared memory, not the row.
- Spans of more than ONE_READ_FROM keys (two tiles) take one read: the first pass copies each
  key above a gate, guessed from the CTA's first tile to leave about twice its share of the best
  k_sel above it, with no CTA barrier (warps claim room; the parts are put in index order after
  the pass), and counts the keys equal to the gate; the digits are read off the copies and
  those counts alone. Where tile 0's chosen first-digit bin holds most of the tile (narrow rows
  such as 1 + 1e-6 randn, tie-heavy rows), the gate is the tile's exact key of that rank, not a
  line through the bin: on rows of one or few values and ReLU zeros that is the tied value, so
  the copy stays small and a CTA whose gate is t streams its span again only until its share
  of the ties (the lowest ids) is out. The answer is exact when every CTA's gate is <= t, which
  is checked. Where it fails (rising, falling or trending rows, whose first tile is not like the
  rest), the CTAs whose copies lack keys >= t copy again with a gate guessed from a sample of
  their whole span, checked the same way; if that fails too (and for shorter spans), two
  passes: after the first digit a CTA whose
  keys at or above t's bucket fit in shared memory copies them there in index order (one CTA
  barrier per tile); tie-heavy spans, whose bucket holds most of the span, pass over it once
  per digit instead (still exact), copying the keys above the bucket on the way. The second
  digit's pass also ANDs and ORs the bucket's keys: where they agree over the cluster the
  bucket is one value, which is t, and the third pass is skipped.
- A row of <= k_sel keys keeps them all: the engine writes every valid id in order and the
  padding without reading a key (and the block-key pre-pass skips such rows).
- Output: each CTA writes its keys > t and its share of the keys == t at an offset from the
  counts of the CTAs before it. Ties at t go to the lowest ids, so ids come out ascending with no
  sort and no approximate bin; nothing is written outside ``out`` (no workspace). A CTA that
  re-streams its span for the output stops once its share is out (on tie-heavy rows the lowest
  ids fill it in the first tiles), or, with a copy of its keys above t, once its ties are out.

Why CuTe DSL: the select needs shared-memory atomics, warp votes, cluster barriers and
distributed shared memory, none of which Triton exposes. docs/topk_engine.md says where the time
goes and which attempts did not pay.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Boolean, Float16, Float32, Int32, Int64, Uint32

from .compile import cached_kernel, fake_stream, fake_tensor
from .cute import begin_marks, block_exclusive, copy_async16, stamp, warps_before, zero_fill

THREADS = 512
WARPS = THREADS // 32
PER = 16  # keys per thread per streamed tile
WARP_SPAN = 32 * PER  # a tile's keys per warp: warp w owns [w * WARP_SPAN, (w + 1) * WARP_SPAN)
TILE = THREADS * PER
BINS = 2048
FINE = BINS // THREADS  # bins per coarse bin of the digit search
DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, bits) of the three radix digits, top first
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
SOURCES = {torch.float32: Float32, torch.bfloat16: BFloat16, torch.float16: Float16, torch.int32: Int32}
# Where a profiled build (RadixTopk(profile=True)) stamps the clock: the end of each phase, as
# cycles since the kernel began (0 for a phase the row did not take).
PHASES = ("first attempt failed", "gated pass + index order", "exchange", "digits from the copies",
          "first-digit pass", "digit 0", "copy pass", "digits 1-2", "offsets", "output", "padding + last barrier")
# Per CTA, after its phases: the global timer (ns, low 32 bits) at its start and its end, to see
# when CTAs run relative to each other (SM clocks are not synchronized across SMs).
PROFILE_SLOTS = len(PHASES) + 2


@cute.jit
def ordered_key(x: Float32) -> Uint32:
    """Unsigned key of an fp32 score in the library order; 0 is below every score (no key).

    Four instructions (this runs on every key of every pass): ``max.f32`` returns its non-NaN
    operand (NaN ranks as -inf), ``-0.0 + 0.0`` is ``+0.0`` in round-to-nearest, neither flushes
    subnormals (no .ftz); then negative scores flip all bits, the rest only the sign."""
    return cute.arch.inline_ptx(
        "{ .reg .f32 f; .reg .b32 s; max.f32 f, {$r0}, 0fFF800000; add.rn.f32 f, f, 0f00000000; "
        "mov.b32 {$w0}, f; shr.s32 s, {$w0}, 31; or.b32 s, s, 0x80000000; xor.b32 {$w0}, {$w0}, s; }",
        write_only_types=[Uint32], read_only_args=[x],
    )


@cute.jit
def key_score(key: Uint32) -> Float32:
    """The fp32 score whose ``ordered_key`` is ``key``: exact for every key but those of -inf and
    +0.0, which NaN and -0.0 share (``KEY_NEG_INF``, ``KEY_ZERO``)."""
    flip = cutlass.select_((key >> Uint32(31)) != Uint32(0), Uint32(0x80000000), Uint32(0xFFFFFFFF))
    return (key ^ flip).bitcast(Float32)


KEY_NEG_INF = 0x007FFFFF  # ordered_key(-inf) = ordered_key(NaN)
KEY_ZERO = 0x80000000  # ordered_key(+0.0) = ordered_key(-0.0)


@cute.jit
def ord16_key(x: Float32) -> Uint32:
    """The DCP merge's key of a score: ord16 of it rounded to bf16 (nearest even, on the bits),
    NaN as -inf, -0.0 as +0.0, shifted up 16 (never 0). Equal bf16 values tie (lower id first)."""
    bits = x.bitcast(Uint32)
    b = (bits + Uint32(0x7FFF) + ((bits >> Uint32(16)) & Uint32(1))) >> Uint32(16)
    b = cutlass.select_(x != x, Uint32(0xFF80), b)  # NaN ranks as -inf
    b = cutlass.select_(b == Uint32(0x8000), Uint32(0), b)  # -0.0 ties +0.0
    ord16 = cutlass.select_(b >= Uint32(0x8000), Uint32(0xFFFF) - b, b | Uint32(0x8000))
    return Uint32(ord16 << Uint32(16))


@cute.jit
def ballot_of(predicate) -> Uint32:
    return Uint32(cute.arch.vote_ballot_sync(predicate))


@cute.jit
def digit_of(key: Uint32, p: cutlass.Constexpr[int]) -> Int32:
    shift, bits = DIGITS[p]
    return Int32((key >> Uint32(shift)) & Uint32((1 << bits) - 1))


@cute.jit
def digit_shift(p: Int32) -> Int32:
    """DIGITS[p]'s shift for a digit index that is not a constant."""
    first, second, third = (Int32(shift) for shift, _ in DIGITS)
    return cutlass.select_(p == 0, first, cutlass.select_(p == 1, second, third))


@cute.jit
def in_prefix(key: Uint32, t: Uint32, p: cutlass.Constexpr[int]):
    """Whether a live key's digits above digit p equal t's."""
    shift, bits = DIGITS[p]
    live = key != Uint32(0)
    if cutlass.const_expr(p > 0):
        live = live & ((key >> Uint32(shift + bits)) == (t >> Uint32(shift + bits)))
    return live


@cute.jit
def load_rank(t: cute.Tensor, i: Int32, rank: Int32) -> Int32:
    """``t[i]`` of cluster CTA ``rank`` (distributed shared memory)."""
    address = Int32((t.iterator + i).toint())
    return cute.arch.inline_ptx(
        "{ .reg .u32 remote; mapa.shared::cluster.u32 remote, {$r0}, {$r1}; "
        "ld.shared::cluster.u32 {$w0}, [remote]; }",
        write_only_types=[Int32], read_only_args=[address, Int32(rank)],
    )


@cute.jit
def cluster_sync(ctas: cutlass.Constexpr[int]):
    """All CTAs of the cluster meet; this CTA's shared-memory writes before it are visible to the
    others' remote reads after it. The release is restricted to shared::cta (what the CTAs
    exchange): a plain cluster arrive releases at GPU scope (MEMBAR.ALL.GPU), ~0.2 us each."""
    if cutlass.const_expr(ctas > 1):
        cute.arch.inline_ptx("fence.release.sync_restrict::shared::cta.cluster;")
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
    else:
        cute.arch.sync_threads()


@cute.jit
def warp_offset(counts: cute.Tensor, mine: Int32, at: Int32, before: Int32, tid: Int32):
    """(``before`` + the lower warps' ``mine``, the sum over every warp): a warp's place in a
    tile's ordered compaction, after publishing its count at ``counts[at + warp]``; one barrier."""
    lane, warp = tid % 32, tid // 32
    if lane == 0:
        counts[at + warp] = mine
    cute.arch.sync_threads()
    below, total = warps_before(counts, warp, WARPS, at)
    return before + below, total


@dataclass(frozen=True)
class Scratch:
    """A CTA's shared memory. ``hist``, ``coarse`` and ``shared`` are read by the cluster's other
    CTAs; ``buf_key`` / ``buf_id`` hold the copy of the keys at or above the threshold's bucket."""

    hist: cute.Tensor  # one 2048-bin histogram per digit
    coarse: cute.Tensor  # per digit, THREADS coarse bins of the digit search
    fine: cute.Tensor  # the chosen coarse bin's fine bins
    counts: cute.Tensor  # compaction: two tiles' (kept, tied) warp counts
    warp_sums: cute.Tensor
    result: cute.Tensor  # the digit search's (digit, keys above)
    shared: cute.Tensor  # (keys above t, keys == t, copied, gate), read by the other CTAs
    claimed: cute.Tensor  # the gated pass's (copy size, keys == gate)
    bounds: cute.Tensor  # (AND, OR) of the keys the digit-1 pass counted, read by the other CTAs
    segments: cute.Tensor  # the gated pass's (tile, warp) parts
    buf_key: cute.Tensor
    buf_id: cute.Tensor
    ring: cute.Tensor  # STAGES tiles of the row


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


class RadixTopk:
    """The engine for one static configuration: source dtype, pinned id or not, cluster size,
    whether float scores are keyed by their bf16 ord16 (the DCP pack) instead of their full bits,
    and whether the output stage reads ``Outputs``' runtime fields (``fused``) or writes ids alone."""

    def __init__(self, source, pinned: bool, ctas: int, ord16: bool = False, profile: bool = False,
                 fused: bool = False):
        self.source, self.pinned, self.ctas, self.ord16, self.fused = source, pinned, ctas, ord16, fused
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
            stream=stream, use_pdl=self.pinned,
        )

    @cute.jit
    def key_of(self, x) -> Uint32:
        if cutlass.const_expr(self.source is Int32):
            key = x.bitcast(Uint32)  # block keys, already ordered
        elif cutlass.const_expr(self.ord16):
            key = ord16_key(x.to(Float32))
        elif cutlass.const_expr(self.source is not Float32):  # bf16 / fp16 widen exactly
            key = ordered_key(x.to(Float32))
        else:
            key = ordered_key(x)
        return key

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

    @cute.jit
    def count_digit(self, src: cute.Tensor, sm: Scratch, span: Span, refetch, p: cutlass.Constexpr[int], t: Uint32,
                    regs: Regs, tid: Int32, high: Uint32 = NO_COPY):
        """Histogram digit p (0, 1, 2) of the span's keys whose higher digits equal t's; for p = 1
        also the AND and the OR of those keys (``bounds``): equal over the cluster, they are t;
        and a copy of the keys >= ``high`` (those above the first digit's bucket), as the gated
        pass copies, for an output stage that then need not read the row for them.

        The first digit counts every slot without a branch: a missing key (0) lands in bin 0,
        which no score reaches (-inf's key is in bin 3), so the digit search never picks it."""
        hist, keys = sm.hist, regs.keys
        every, some = Uint32(0xFFFFFFFF), Uint32(0)  # AND and OR: two logic ops a key, not compares
        self.begin_pass(src, sm.ring, span, refetch, tid)
        for tile in range(span.tiles):
            self.next_tile(src, sm.ring, span, tile, refetch, regs, tid)
            for i in cutlass.range_constexpr(PER):
                if cutlass.const_expr(p == 0):
                    cute.arch.atomic_add(hist.iterator + digit_of(keys[i], 0), Int32(1))
                elif in_prefix(keys[i], t, p):
                    cute.arch.atomic_add(hist.iterator + (p * BINS + digit_of(keys[i], p)), Int32(1))
                    if cutlass.const_expr(p == 1 and not self.ord16):  # ord16 rows never read them
                        every, some = every & keys[i], some | keys[i]
            if cutlass.const_expr(p == 1 and not self.ord16):
                if high != NO_COPY:  # one build of the loop for both: a second costs long rows 15%
                    self.append_tile(regs, high, tile, sm, tid)
        if cutlass.const_expr(p == 1 and not self.ord16):
            every = cute.arch.warp_redux_sync(every, "and")
            some = cute.arch.warp_redux_sync(some, "or")
            if tid % 32 == 0:
                cute.arch.atomic_and(sm.bounds.iterator, every)
                cute.arch.atomic_or(sm.bounds.iterator + 1, some)
        cute.arch.sync_threads()

    @cute.jit
    def single_valued(self, sm: Scratch, tid: Int32):
        """(whether every key that the cluster's digit-1 pass counted is one value, that value),
        from ``bounds`` after the digit search's cluster barrier: lane l of each warp reads one
        word of CTA l // 2, so a warp issues one remote load."""
        lane = tid % 32
        at = lane % 2
        v = sm.bounds[at]
        if cutlass.const_expr(self.ctas > 1):
            v = Uint32(load_rank(sm.bounds, at, min(lane // 2, Int32(self.ctas - 1))))
        every = cute.arch.warp_redux_sync(Uint32(cutlass.select_(at == 0, v, Uint32(0xFFFFFFFF))), "and")
        some = cute.arch.warp_redux_sync(Uint32(cutlass.select_(at == 1, v, Uint32(0))), "or")
        return Int32(every == some), some

    @cute.jit
    def copy_tile(self, regs: Regs, t: Uint32, sm: Scratch, written: Int32, parity: Int32, tid: Int32) -> Int32:
        """Copy a tile's keys >= t (t: the first digit's bucket, > 0) and their ids after the
        ``written`` before them, in index order, and histogram the second digit of those in the
        bucket. Returns how many it copied.

        Few keys reach the bucket, so a 32-key group without one costs a compare, a vote and a
        popcount; the atomics and the stores run under a warp-uniform branch."""
        keys, ids = regs.keys, regs.ids
        lane = tid % 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        kept_at = parity * 2 * WARPS
        votes = cute.make_rmem_tensor(PER, Uint32)
        kept_n = Int32(0)
        for i in cutlass.range_constexpr(PER):
            votes[i] = ballot_of(keys[i] >= t)
            kept_n = kept_n + Int32(cute.arch.popc(votes[i]))
        slot, added = warp_offset(sm.counts, kept_n, kept_at, written, tid)
        for i in cutlass.range_constexpr(PER):
            if votes[i] != Uint32(0):
                if keys[i] >= t:
                    at = slot + Int32(cute.arch.popc(votes[i] & lower))
                    sm.buf_key[at] = keys[i]
                    sm.buf_id[at] = ids[i]
                    if in_prefix(keys[i], t, 1):
                        cute.arch.atomic_add(sm.hist.iterator + (BINS + digit_of(keys[i], 1)), Int32(1))
                slot = slot + Int32(cute.arch.popc(votes[i]))
        return added

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
    def find_digit(self, sm: Scratch, base: Int32, need: Int32, tid: Int32, local: cutlass.Constexpr[bool] = False):
        """(d, above, own): the digit d whose bin, counting down from the top bin of the cluster's
        histograms at ``base`` (this CTA's alone with ``local``), reaches ``need``; how many keys
        the bins above d hold; this thread's share of this CTA's keys in them. Two rounds of
        remote reads: THREADS coarse bins, then the FINE bins of the chosen one (remote loads are
        slow, so each thread issues few)."""
        hist, coarse, fine, result, warp_sums = sm.hist, sm.coarse, sm.fine, sm.result, sm.warp_sums
        ctas = 1 if local else self.ctas
        slot = base // BINS * THREADS
        mine = Int32(0)
        for b in cutlass.range_constexpr(FINE):
            mine = mine + hist[base + tid * FINE + (b + tid) % FINE]  # rotated: fewer bank conflicts
        coarse[slot + tid] = mine
        cluster_sync(ctas)
        # Coarse bin c covers bins [c * FINE, (c + 1) * FINE); thread THREADS-1-c scans it so the
        # exclusive scan counts the bins above.
        from_top = THREADS - 1 - tid
        mirrored = self.cluster_sum(coarse, slot + from_top, ctas)
        above, _ = block_exclusive(mirrored, warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        if (above < need) & (above + mirrored >= need):
            result[0] = from_top
            result[1] = above
        cute.arch.sync_threads()
        chosen = result[0]
        if tid < FINE:
            fine[tid] = self.cluster_sum(hist, base + chosen * FINE + tid, ctas)
        cute.arch.sync_threads()
        if tid == 0:
            run = result[1]
            found = Int32(0)
            for b in cutlass.range_constexpr(FINE):
                v = fine[FINE - 1 - b]
                if (found == 0) & (run + v >= need):
                    result[0] = chosen * FINE + FINE - 1 - b
                    result[1] = run
                    found = Int32(1)
                run = run + v
        cute.arch.sync_threads()
        digit = result[0]
        above = result[1]
        own = Int32(0)
        if tid > chosen:
            own = coarse[slot + tid]
        if tid < FINE:
            if chosen * FINE + tid > digit:
                own = own + hist[base + chosen * FINE + tid]
        cute.arch.sync_threads()
        return digit, above, own

    @cute.jit
    def cluster_sum(self, t: cute.Tensor, i: Int32, ctas: cutlass.Constexpr[int]) -> Int32:
        """``t[i]`` summed over the first ``ctas`` CTAs of the cluster (all remote loads issued
        before the adds)."""
        v = t[i]
        if cutlass.const_expr(ctas > 1):
            parts = cute.make_rmem_tensor(ctas, Int32)
            for r in cutlass.range_constexpr(ctas):
                parts[r] = load_rank(t, i, r)
            v = Int32(0)
            for r in cutlass.range_constexpr(ctas):
                v = v + parts[r]
        return v

    @cute.jit
    def append_tile(self, regs: Regs, gate: Uint32, j: Int32, sm: Scratch, tid: Int32) -> Int32:
        """The gated pass's copy of tile j, with no CTA barrier: the warp claims room for its keys
        >= gate (one shared atomic) and writes them there in index order, each id tagged with its
        (tile, warp) part; ``segments`` records where each part went and its size. Returns the
        claims so far as this warp saw them."""
        keys, ids = regs.keys, regs.ids
        claimed, segments, buf_key, buf_id = sm.claimed, sm.segments, sm.buf_key, sm.buf_id
        lane, warp = tid % 32, tid // 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        votes = cute.make_rmem_tensor(PER, Uint32)
        kept_n = Int32(0)
        for i in cutlass.range_constexpr(PER):
            votes[i] = ballot_of(keys[i] >= gate)
            kept_n = kept_n + Int32(cute.arch.popc(votes[i]))
        start = Int32(0)
        if kept_n > 0:
            if lane == 0:
                start = cute.arch.atomic_add(claimed.iterator, kept_n)
            start = cute.arch.shuffle_sync(start, 0)
            slot = start
            for i in cutlass.range_constexpr(PER):
                if votes[i] != Uint32(0):
                    at = slot + Int32(cute.arch.popc(votes[i] & lower))
                    if (keys[i] >= gate) & (at < CAP):
                        buf_key[at] = keys[i]
                        buf_id[at] = Int32((Uint32(j * WARPS + warp) << Uint32(ID_BITS)) | Uint32(ids[i]))
                    slot = slot + Int32(cute.arch.popc(votes[i]))
        if lane == 0:
            segments[j * WARPS + warp] = (start << 16) | kept_n
        return start + kept_n

    @cute.jit
    def in_index_order(self, tiles: Int32, sm: Scratch, copied: Int32, tid: Int32, to: Int32 = 0):
        """Put the gated pass's copy in index order, at ``to``..: a (tile, warp) part goes after
        every part of the tiles before it and of the lower warps in its tile. One scan of the part
        sizes turns ``segments`` into each part's shift; every entry then moves by its part's
        shift, staged through the ring (free after the pass)."""
        segments, buf_key, buf_id, warp_sums = sm.segments, sm.buf_key, sm.buf_id, sm.warp_sums
        parts = tiles * WARPS
        each = (parts + THREADS - 1) // THREADS
        mine = Int32(0)
        for q in range(each):
            if tid * each + q < parts:
                mine = mine + (segments[tid * each + q] & 0xFFFF)
        run, _ = block_exclusive(mine, warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        for q in range(each):
            if tid * each + q < parts:
                part = segments[tid * each + q]
                segments[tid * each + q] = run - (part >> 16)
                run = run + (part & 0xFFFF)
        cute.arch.sync_threads()
        staged = cute.recast_tensor(sm.ring, Int32)
        for e in range(tid, copied, THREADS):
            tagged = Uint32(buf_id[e])
            at = e + segments[Int32(tagged >> Uint32(ID_BITS))]
            staged[at] = Int32(buf_key[e])
            staged[CAP + at] = Int32(tagged & Uint32((1 << ID_BITS) - 1))
        self.unstage(sm, copied, to, tid)

    @cute.jit
    def to_end(self, sm: Scratch, n: Int32, tid: Int32):
        """Move the copy's n entries from buf[0, n) to buf[CAP - n, CAP), staged through the ring
        (free after the gated pass)."""
        staged = cute.recast_tensor(sm.ring, Int32)
        for e in range(tid, n, THREADS):
            staged[e] = Int32(sm.buf_key[e])
            staged[CAP + e] = sm.buf_id[e]
        self.unstage(sm, n, CAP - n, tid)

    @cute.jit
    def unstage(self, sm: Scratch, n: Int32, to: Int32, tid: Int32):
        """buf[to, to + n) from the n entries staged in the ring (keys from 0, ids from CAP),
        between CTA barriers."""
        staged = cute.recast_tensor(sm.ring, Int32)
        cute.arch.sync_threads()
        for e in range(tid, n, THREADS):
            sm.buf_key[to + e] = Uint32(staged[e])
            sm.buf_id[to + e] = staged[CAP + e]
        cute.arch.sync_threads()

    @cute.jit
    def gated_copy(self, src: cute.Tensor, sm: Scratch, span: Span, target: Int32, sampled: cutlass.Constexpr[bool],
                   regs: Regs, tid: Int32):
        """The one-read path's pass: copy the span's keys >= a gate, in index order (every key
        when the span fits the copy, gate 0; else a gate guessed to leave about ``target`` above
        it, from tile 0, or with ``sampled`` from a sample of the whole span). Where the guess
        says the keys equal to the gate are many (it is a tied value), copy the keys above it and
        count those equal to it: that keeps the copy small on tie-heavy rows (narrow rows, whose
        ties are few, copy them).
        Warps run through it with no CTA barrier after tile 0 and stop once the copy overflows.
        Returns (how many keys it copied, > CAP if it overflowed; the gate; how many equal to it
        it counted, not copied). Leaves the ring overwritten."""
        gate = Uint32(0)
        counts_ties = Int32(0)  # 1: keys == gate are counted, not copied
        seen = Int32(0)
        tied = Int32(0)  # this thread's keys == gate
        guessed = span.hi - span.lo > CAP
        if cutlass.const_expr(sampled):
            if guessed:  # before the pass: the tile loop stays as it was
                self.fetch_sample(src, sm, span, tid)
                cute.arch.cp_async_wait_group(0)
                self.sample_keys(sm, span, regs, tid)
                gate, counts_ties = self.guess_gate(regs, span, target, True, sm, tid)
        self.begin_pass(src, sm.ring, span, True, tid)
        for tile in range(span.tiles):
            if seen <= CAP:
                self.next_tile(src, sm.ring, span, tile, True, regs, tid)
                if cutlass.const_expr(not sampled):
                    if (tile == 0) & guessed:
                        gate, counts_ties = self.guess_gate(regs, span, target, False, sm, tid)
                seen = self.append_tile(regs, gate + Uint32(counts_ties), tile, sm, tid)
                for i in cutlass.range_constexpr(PER):
                    tied = tied + Int32(regs.keys[i] == gate)
        tied = cute.arch.warp_redux_sync(tied, "add")
        if (tid % 32 == 0) & (counts_ties != 0):
            cute.arch.atomic_add(sm.claimed.iterator + 1, tied)
        cute.arch.cp_async_wait_group(0)  # nothing left in flight into the ring
        cute.arch.sync_threads()
        copied = sm.claimed[0]
        if copied <= CAP:
            self.in_index_order(span.tiles, sm, copied, tid)
        return copied, gate, sm.claimed[1]

    @cute.jit
    def digits_from_copy(self, first: cutlass.Constexpr[int], sm: Scratch, kept: Int32, t: Uint32, need: Int32,
                         above_part: Int32, tid: Int32, src=None, span=None, refetch=None, regs=None, bucket=None,
                         gate=None, at_gate=None):
        """Digits ``first``.. of t (with its digits above already in ``t``), counted from the copy,
        which holds every key of the span >= t. From digit 0 (the one-read path) the copy holds
        the keys above ``gate`` and ``at_gate`` keys equal to it are counted as well. From digit
        1 (the two-pass path) the second digit is already counted, and a span too tie-heavy to
        copy counts the third over the row, unless the keys of the first digit's bucket
        (``bucket`` of them in the cluster) all share their second digit and the pass over them
        found them one value (then that is t).
        Returns (t, how many keys == t the best k_sel take, this CTA's keys > t, its keys == t)."""
        last = 1 if self.ord16 else 2
        if cutlass.const_expr(first == 0):
            for p in range(last + 1):
                self.count_copied(sm, kept, t, p, tid, gate, at_gate)
                cute.arch.sync_threads()
                digit, above, own = self.find_digit(sm, p * BINS, need, tid)
                need = need - above
                above_part = above_part + own
                t = t | (Uint32(digit) << Uint32(digit_shift(p)))
            tied = sm.hist[last * BINS + digit_of(t, last)]
        else:
            settled = Int32(0)
            tied_at = Int32(0)  # the histogram bin that holds this CTA's keys == t
            for p in range(1, last + 1):
                if settled == 0:
                    if p == 2:
                        if kept <= CAP:
                            self.count_copied(sm, kept, t, p, tid)
                        else:
                            self.count_digit(src, sm, span, refetch, 2, t, regs, tid)
                        cute.arch.sync_threads()
                    digit, above, own = self.find_digit(sm, p * BINS, need, tid)
                    need = need - above
                    above_part = above_part + own
                    t = t | (Uint32(digit) << Uint32(digit_shift(p)))
                    tied_at = p * BINS + digit
                    if cutlass.const_expr(not self.ord16):
                        if (p == 1) & (sm.fine[digit % FINE] == bucket):  # the same in every CTA
                            settled, value = self.single_valued(sm, tid)
                            t = Uint32(cutlass.select_(settled != 0, value, t))
            tied = sm.hist[tied_at]
        _, mine_above = block_exclusive(above_part, sm.warp_sums, tid, WARPS)
        cute.arch.sync_threads()  # warp_sums is reused next
        return t, need, mine_above, tied

    @cute.jit
    def count_copied(self, sm: Scratch, kept: Int32, t: Uint32, p: Int32, tid: Int32, extra=None, extra_n=None):
        """Histogram digit p (0, 1, 2; not a constant) of the copied keys whose higher digits
        equal t's, and ``extra_n`` more keys equal to ``extra`` (keys counted, not copied).
        Copied keys are live."""
        shift = digit_shift(p)
        mask = cutlass.select_(p == 2, Uint32((1 << DIGITS[2][1]) - 1), Uint32((1 << DIGITS[1][1]) - 1))
        above = Uint32(cutlass.select_(p == 1, Int32(DIGITS[0][0]), Int32(DIGITS[1][0])))  # higher digits', p >= 1
        for j in range(tid, kept, THREADS):
            key = sm.buf_key[j]
            if (p == 0) | ((key >> above) == (t >> above)):
                cute.arch.atomic_add(sm.hist.iterator + (p * BINS + Int32((key >> Uint32(shift)) & mask)), Int32(1))
        if cutlass.const_expr(extra is not None):
            if (tid == 0) & (extra_n > 0) & ((p == 0) | ((extra >> above) == (t >> above))):
                cute.arch.atomic_add(sm.hist.iterator + (p * BINS + Int32((extra >> Uint32(shift)) & mask)), extra_n)

    @cute.jit
    def sample_at(self, span: Span, tid: Int32) -> Int32:
        """Where thread tid's chunk of the gate's sample starts: tid / THREADS of the way through
        the span, rounded down to 16 bytes in memory as the tiles are (``base`` is aligned)."""
        vec = 16 // (self.source.width // 8)
        p = span.lo + Int32(Int64(tid) * Int64(span.hi - span.lo) // Int64(THREADS))
        return p - (p - span.base) % vec

    @cute.jit
    def fetch_sample(self, src: cute.Tensor, sm: Scratch, span: Span, tid: Int32):
        """Start copying the gate's sample, one 16-byte chunk a thread spread evenly over the span,
        into ``buf_id`` (free until the gated pass copies)."""
        size = self.source.width // 8
        at = self.sample_at(span, tid)
        chunk = Int64((src.iterator + (span.row_off + Int64(at))).toint())
        copy_async16(Int32((sm.buf_id.iterator + tid * 4).toint()), chunk, min(span.hi - at, Int32(16 // size)) * size)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def sample_keys(self, sm: Scratch, span: Span, regs: Regs, tid: Int32):
        """The sample's keys (``fetch_sample``, complete) in this thread's first slots of ``keys``,
        0 (no key) in the rest and outside [lo, hi)."""
        vec = 16 // (self.source.width // 8)
        at = self.sample_at(span, tid)
        raw = cute.recast_tensor(sm.buf_id, self.source)
        for i in cutlass.range_constexpr(PER):
            if cutlass.const_expr(i < vec):
                inside = (at + i >= span.lo) & (at + i < span.hi)
                regs.keys[i] = Uint32(cutlass.select_(inside, self.key_of(raw[tid * vec + i]), Uint32(0)))
            else:
                regs.keys[i] = Uint32(0)

    @cute.jit
    def guess_gate(self, regs: Regs, span: Span, target: Int32, sampled: cutlass.Constexpr[bool], sm: Scratch,
                   tid: Int32):
        """A key g with about ``target`` of the span's keys at or above it, read off tile 0 or,
        with ``sampled``, the sample (``keys``): the first digit's histogram of those keys, then a
        straight line through the chosen bin; where that bin holds most of them (narrow or
        tie-heavy rows, where a line through it means nothing), their exact key of that rank
        from two more local digits.
        Only a guess: the one-read path checks it afterwards. Returns (the gate, whether the
        gated pass counts the keys equal to it instead of copying them: where the tile holds
        many keys equal to an exact gate, as on rows of one or few values and ReLU zeros)."""
        hi, lo = span.hi, span.lo
        sample = min(hi, span.base + TILE) - lo
        if cutlass.const_expr(sampled):
            sample = Int32(THREADS * (16 // (self.source.width // 8)))
        r = Int32((Int64(target) * Int64(sample) + Int64(hi - lo - 1)) // Int64(hi - lo))
        for i in cutlass.range_constexpr(PER):
            cute.arch.atomic_add(sm.hist.iterator + (2 * BINS + digit_of(regs.keys[i], 0)), Int32(1))
        cute.arch.sync_threads()
        d, above, _ = self.find_digit(sm, Int32(2 * BINS), r, tid, local=True)
        in_bin = Int64(sm.hist[2 * BINS + d])
        shift = DIGITS[0][0]  # a first-digit bin holds 2**shift keys
        inside = (in_bin - Int64(r - above)) * Int64(1 << shift) // in_bin
        gate = Uint32((Int64(d) << Int64(shift)) + inside)
        counts_ties = Int32(0)
        if in_bin > 4 * Int64(r):  # histograms 1 and 0 are still zero (the gated pass runs first)
            g = Uint32(d) << Uint32(shift)
            need = r - above
            for p in cutlass.range_constexpr(1, 3):
                for i in cutlass.range_constexpr(PER):
                    if in_prefix(regs.keys[i], g, p):
                        cute.arch.atomic_add(sm.hist.iterator + ((2 - p) * BINS + digit_of(regs.keys[i], p)), Int32(1))
                cute.arch.sync_threads()
                d, above, _ = self.find_digit(sm, Int32((2 - p) * BINS), need, tid, local=True)
                need = need - above
                g = g | (Uint32(d) << Uint32(DIGITS[p][0]))
            gate = g
            # The tile's keys == g (its last digit's bin), scaled to the span: where they would
            # fill half the copy's room beyond the target (rows of one or few values, ReLU
            # zeros), count them instead. Narrow rows have few keys a value: those are copied,
            # so a CTA whose gate turns out to be t needs no second read for its ties.
            ties_in_span = Int64(sm.hist[digit_of(g, 2)]) * Int64(hi - lo)
            counts_ties = Int32(2 * ties_in_span > Int64(CAP - target) * Int64(sample))
        return gate, counts_ties

    @cute.jit
    def wait_for_keys(self):
        """Block keys: the engine is launched as a programmatic dependent of the block-key pre-pass
        (its launch and setup overlap the pre-pass), so it waits for the pre-pass here."""
        if cutlass.const_expr(self.pinned):
            cute.arch.griddepcontrol_wait()

    @cute.jit
    def emit(self, o: Outputs, src: cute.Tensor, row: Int32, first: Int32, at: Int32, id: Int32):
        """Output slot ``at`` of the row: ``id`` (-1: padding, which maps to -1 and the value
        -inf) and what ``o`` asks beside it in a fused build. ``first``: the window's start in
        ``src``. For the short stretches (keep_all, padding); kept ids go through ``flush``."""
        if cutlass.const_expr(not self.fused):
            o.out[row, at] = id
        else:
            mapped = id
            if (o.page > 0) & (id >= 0):
                mapped = o.table[row, id // o.page] * o.page + id % o.page
            o.out[row, at] = mapped
            if (o.want & 1) != 0:
                o.raw[row, at] = id
            if cutlass.const_expr(not self.pinned):
                if (o.want & 2) != 0:
                    value = Float32(-Float32.inf).to(o.values.element_type)
                    if id >= 0:
                        value = src[row, first + id]
                    o.values[row, at] = value

    @cute.jit
    def keep_all(self, o: Outputs, src: cute.Tensor, row: Int32, first: Int32, first_id: Int32, count: Int32,
                 rank: Int32, tid: Int32):
        """A row with nothing to select writes ids ``first_id .. first_id + count - 1`` then -1,
        whatever the keys hold: a row of <= k_sel keys (blocks: besides the pinned newest) keeps
        every valid id (first_id 0, count valid); with k_sel = 0 a pinned row keeps its newest
        block alone. No key is read; the cluster's CTAs write interleaved stretches."""
        for i in range(rank * THREADS + tid, o.out.shape[1], self.ctas * THREADS):
            self.emit(o, src, row, first, i, cutlass.select_(i < count, first_id + i, Int32(-1)))

    @cute.kernel
    def kernel(self, src: cute.Tensor, lengths: cute.Tensor, starts: cute.Tensor, windowed: Int32, cols: Int32,
               block: Int32, k_sel: Int32, out: cute.Tensor, raw: cute.Tensor, table: cute.Tensor, page: Int32,
               values: cute.Tensor, want: Int32):
        tid, _, _ = cute.arch.thread_idx()
        lane, warp = tid % 32, tid // 32
        rank, row, _ = cute.arch.block_idx()

        smem = cutlass.memory.SmemAllocator()
        hist = smem.allocate_tensor(Int32, cute.make_layout(3 * BINS), 16)  # one per digit, read remotely
        coarse = smem.allocate_tensor(Int32, cute.make_layout(3 * THREADS), 16)  # per digit, read remotely
        fine = smem.allocate_tensor(Int32, cute.make_layout(FINE), 16)
        counts = smem.allocate_tensor(Int32, cute.make_layout(4 * WARPS), 16)  # compaction: 2 tiles x 2 counts
        warp_sums = smem.allocate_tensor(Int32, cute.make_layout(WARPS), 16)
        result = smem.allocate_tensor(Int32, cute.make_layout(2), 16)
        shared = smem.allocate_tensor(Int32, cute.make_layout(4), 16)  # read by the other CTAs
        claimed = smem.allocate_tensor(Int32, cute.make_layout(2), 16)  # the gated pass's copy
        segments = smem.allocate_tensor(Int32, cute.make_layout(MAX_TILES * WARPS), 16)
        buf_key = smem.allocate_tensor(Uint32, cute.make_layout(CAP), 16)  # the copy of step 1
        buf_id = smem.allocate_tensor(Int32, cute.make_layout(CAP), 16)
        ring = smem.allocate_tensor(self.source, cute.make_layout(STAGES * TILE), 16)  # tiles of the row
        # Last: the arrays above keep their offsets (a shift of the ring by 16 bytes cost randn rows).
        bounds = smem.allocate_tensor(Uint32, cute.make_layout(2), 16)
        gate_ties = smem.allocate_tensor(Int32, cute.make_layout(1), 16)  # keys == gate counted, read remotely
        sm = Scratch(hist, coarse, fine, counts, warp_sums, result, shared, claimed, bounds, segments, buf_key, buf_id,
                     ring)
        keys = cute.make_rmem_tensor(PER, Uint32)
        ids = cute.make_rmem_tensor(PER, Int32)
        regs = Regs(keys, ids)
        marks = cute.make_rmem_tensor(len(PHASES) + 1, Int64)
        began = Int64(0)
        if cutlass.const_expr(self.profile):
            began = cute.arch.globaltimer()  # ns, the same clock on every SM
        begin_marks(marks, PHASES, self.profile)

        # The row's window of columns [first, end) (first = 0 unless ``windowed``; ids count from
        # first), its valid keys (blocks: all valid blocks but the pinned newest) and this CTA's span.
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
        span = Span(row_off, base, lo, hi, tiles)
        refetch = Boolean(True)  # False once the first pass has left the whole span in the ring

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
            # 1. The k_sel-th largest key t of the row, one 11/11/10-bit digit at a time, histograms
            # summed over the cluster. `take`: how many keys equal to t the best k_sel hold.
            # `mine_above` / `mine_tied`: this CTA's keys > t / == t.
            t = Uint32(0)
            take = Int32(0)
            mine_above = hi - lo
            mine_tied = Int32(0)
            kept = Int32(0)
            last = 1 if self.ord16 else 2  # ord16 keys (ord16 << 16) are whole after two digits
            zero_fill(hist, 3 * BINS, tid, THREADS)
            if tid == 0:
                claimed[0] = Int32(0)
                claimed[1] = Int32(0)
                bounds[0] = Uint32(0xFFFFFFFF)
                bounds[1] = Uint32(0)
            cute.arch.sync_threads()
            found = Int32(0)
            above_only = Int32(0)  # the copy holds this CTA's keys > t alone (its keys == t are not in it)
            high_n = Int32(-1)  # the tie path's copy of the keys above the first digit's bucket, -1: none
            # One read of long spans: copy the keys above a guessed gate in the first pass and
            # select from the copies alone. Exact when every CTA's gate is <= t (then the copies
            # hold every key >= t), which the end checks; else the two-pass path below.
            share = Int32((Int64(k_sel) * Int64(per_cta) + Int64(n - 1)) // Int64(n))
            target = min(2 * share, Int32(CAP * 3 // 4))
            if (per_cta > ONE_READ_FROM) & (4 * target >= 5 * share):
                # Where that fails, a second attempt before the two passes: each CTA whose copy
                # lacks some of its keys >= t (it overflowed, its gate is above t, or the copies
                # held fewer than k_sel) copies again, its gate guessed from a sample of its whole
                # span for up to CAP * 3 / 4 keys. Rising, falling and trending rows, whose first
                # tiles are not like the rest, pay it; rows that the first attempt answers do not.
                gate, at_gate = Uint32(0), Int32(0)
                redo = Int32(1)
                again = Int32(1)
                copied, gates = cute.make_rmem_tensor(self.ctas, Int32), cute.make_rmem_tensor(self.ctas, Uint32)
                ties = cute.make_rmem_tensor(self.ctas, Int32)
                # Unrolled: as a runtime loop the first attempt's pass ran slower (64x1M rows whose
                # ties at the gate are counted: 96 us against 82).
                for attempt in cutlass.range_constexpr(2):
                    if again != 0:
                        if redo != 0:
                            kept, gate, at_gate = self.gated_copy(src, sm, span,
                                                                  target if attempt == 0 else Int32(CAP * 3 // 4),
                                                                  attempt == 1, regs, tid)
                            if tid == 0:
                                shared[2] = kept
                                shared[3] = Int32(gate)
                                gate_ties[0] = at_gate
                        self.mark(marks, "gated pass + index order")
                        zero_fill(hist, 3 * BINS, tid, THREADS)
                        cluster_sync(self.ctas)
                        for r in cutlass.range_constexpr(self.ctas):
                            copied[r] = load_rank(shared, Int32(2), r)
                            gates[r] = Uint32(load_rank(shared, Int32(3), r))
                            ties[r] = load_rank(gate_ties, Int32(0), r)
                        total = Int32(0)
                        fits = Int32(1)
                        highest = gates[0]
                        for r in cutlass.range_constexpr(self.ctas):
                            total = total + copied[r] + ties[r]
                            fits = fits & Int32(copied[r] <= CAP)
                            # Not max(): the DSL's max of a constant Uint32 and a key compares signed.
                            highest = cutlass.select_(gates[r] > highest, gates[r], highest)
                        self.mark(marks, "exchange")
                        if (total >= k_sel) & (fits == 1):
                            t, take, mine_above, mine_tied = self.digits_from_copy(0, sm, kept, Uint32(0), k_sel,
                                                                                   Int32(0), tid, gate=gate,
                                                                                   at_gate=at_gate)
                            found = Int32(t >= highest)
                            # The copy lacks this CTA's keys == t when t is its gate and they were
                            # counted: the output streams the span for them (until its share is out).
                            above_only = Int32((t >= highest) & (t == gate) & (at_gate > 0))
                            self.mark(marks, "digits from the copies")
                        if found == 0:
                            cluster_sync(self.ctas)  # the others are done reading this CTA's words
                            zero_fill(hist, 3 * BINS, tid, THREADS)
                            if tid == 0:
                                claimed[0] = Int32(0)
                                claimed[1] = Int32(0)
                            cute.arch.sync_threads()
                            if cutlass.const_expr(attempt == 0):
                                self.mark(marks, "first attempt failed")
                        if cutlass.const_expr(attempt == 0):
                            # t is 0 unless the digits ran (fits): then every CTA but the overflowed
                            # ones keeps its copy.
                            redo = Int32((kept > CAP) | ((fits == 1) & ((total < k_sel) | (gate > t))))
                            again = Int32(found == 0)
                refetch = Boolean(True)
            if found == 0:
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

            self.mark(marks, "digits 1-2")

            # 2. Output offsets: CTAs write in rank order; ties at t go to the lowest ids.
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
            self.mark(marks, "offsets")
            # Ties need ranks in index order only when some of them are left out.
            ranked = (eq_before < take) & (eq_before + mine_tied > take)

            # 3. The kept ids, in index order: from the copy when there is one, else from the row.
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
                ranked = ranked | (from_copy != 0)
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
            self.mark(marks, "output")
            if rank == self.ctas - 1:
                pad_from = out_total
                if cutlass.const_expr(self.pinned):
                    if valid > 0:
                        if (tid == 0) & (out_total < out.shape[1]):
                            self.emit(o, src, row, first, out_total, valid - 1)
                        pad_from = out_total + 1
                for i in range(pad_from + tid, out.shape[1], THREADS):
                    self.emit(o, src, row, first, i, Int32(-1))
            cute.arch.cp_async_wait_group(0)  # tiles requested before the output stopped early
            cluster_sync(self.ctas)  # no CTA leaves while others may read its shared memory
        if cutlass.const_expr(self.profile):  # after the ids: out[row, k_sel + 1 + rank * PROFILE_SLOTS ...]
            self.mark(marks, "padding + last barrier")
            ended = cute.arch.globaltimer()
            if tid == 0:
                at = k_sel + 1 + rank * PROFILE_SLOTS
                for phase in cutlass.range_constexpr(len(PHASES)):
                    out[row, at + phase] = Int32(marks[phase + 1] - marks[0])
                out[row, at + len(PHASES)] = Int32(began & Int64(0xFFFFFFFF))
                out[row, at + len(PHASES) + 1] = Int32(ended & Int64(0xFFFFFFFF))


# ------------------------------------------------------------------------------- launching


def cluster_size(rows: int, keys_per_row: int, sms: int) -> int:
    """CTAs per row: one per 8K keys up to 8, while every row's cluster fits the GPU at once.

    The engine's registers (over 64 per thread) leave room for one 512-thread CTA per SM, and a
    cluster must sit in one GPC, so clusters of 4 and 8 fit about half as often as ``sms / S``
    (H200, measured: 32 rows x 4 CTAs and 64 x 8 ran in two waves, 64 x 2 and 8 x 8 in one)."""
    ctas = 1
    while ctas < MAX_CLUSTER and ctas * SPAN_PER_CTA < keys_per_row:
        wider = 2 * ctas
        if rows * wider > (sms if wider <= 2 else sms // 2):
            break
        ctas = wider
    return ctas


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def catalog(target) -> list[tuple]:
    """Every configuration the ops can take (k and the sizes are runtime values): block keys with
    the pinned block, scores by their full bits and by their bf16 ord16 (the DCP pack), each
    source with and without the fused outputs, at every cluster size."""
    configs = []
    for ctas in CLUSTER_SIZES:
        for source in SOURCES:
            configs.append((source, source is torch.int32, ctas))
            configs.append((source, source is torch.int32, ctas, False, False, True))
        for source in (torch.float32, torch.bfloat16):
            configs.append((source, False, ctas, True))
    return configs


@cached_kernel("topk_engine", catalog)
def compiled(source: torch.dtype, pinned: bool, ctas: int, ord16: bool = False, profile: bool = False,
             fused: bool = False):
    """The engine at one (source dtype, pinned, cluster size, ord16 keys, profile marks, fused
    outputs), from fake tensors (no GPU needed)."""
    rows, width = cute.sym_int(), cute.sym_int()
    dtype = SOURCES[source]
    src = fake_tensor(dtype, (rows, width), (cute.sym_int64(), 1))
    lengths = fake_tensor(Int32, (rows,), (1,))
    starts = fake_tensor(Int32, (rows,), (1,))
    out, raw, table = (fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1)) for _ in range(3))
    values = fake_tensor(dtype, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1))
    engine = RadixTopk(dtype, pinned, ctas, ord16, profile, fused)
    return cute.compile(engine, src, lengths, starts, Int32(0), Int32(0), Int32(1), Int32(1), out, raw, table,
                        Int32(0), values, Int32(0), fake_stream(), options="--enable-tvm-ffi")


_NONE: dict = {}  # (device, dtype) -> an empty [0, 0] tensor: the kernel's stand-in for an absent output


def _none(like: torch.Tensor) -> torch.Tensor:
    key = (like.device, like.dtype)
    if key not in _NONE:
        _NONE[key] = torch.empty(0, 0, dtype=like.dtype, device=like.device)  # no memory: graph-safe
    return _NONE[key]


def select(src: torch.Tensor, lengths: torch.Tensor, cols: int, block: int, k_sel: int, out: torch.Tensor,
           pinned: bool, ord16: bool = False, starts: torch.Tensor | None = None, table: torch.Tensor | None = None,
           page: int = 0, raw: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
    """Row r selects over columns [starts[r], lengths[r]) (clamped to [0, cols]; without
    ``starts``, from 0), ids counted from the window's start. Token sources are read from there;
    block keys (``pinned``) hold the window's blocks from 0. With ``table`` and ``page`` > 0,
    ``out`` gets each id through the table (``Outputs``); ``raw`` the ids themselves; ``values``
    (token sources) the selected scores."""
    rows = out.shape[0]
    if rows == 0:
        return
    ctas = cluster_size(rows, src.shape[1], sm_count(src.device))
    windowed = starts is not None
    want = int(raw is not None) | 2 * int(values is not None)
    fused = table is not None or want != 0
    compiled(src.dtype, pinned, ctas, ord16, fused=fused)(
        src, lengths, starts if windowed else lengths, int(windowed), cols, block, k_sel, out,
        _none(out) if raw is None else raw, out if table is None else table, page if table is not None else 0,
        _none(src) if values is None else values, want)


def select_ord16(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """The DCP pack's local top-k: scores ranked by their bf16 ord16 (ties to the lower index),
    ids ascending, -1 padded."""
    select(scores, lengths, scores.shape[1], 1, k, out, pinned=False, ord16=True)
