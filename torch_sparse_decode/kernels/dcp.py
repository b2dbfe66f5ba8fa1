"""CUDA kernels of the DCP decode top-k merge (SPEC 2.3, 2.4): ``dcp_topk_merge`` (the full step),
and the one-round pack, merge and symmetric-memory step behind it.

- Pack: the top-k engine (``kernels/topk.py``, keyed by each score's bf16 ord16) selects the
  rank's local top-K, ties to the lower local id (the merge's order), ids ascending;
  ``_pack_rows`` recomputes their ord16 (bf16 rounding on the bits, so the CPU interpreter and
  the GPU agree bit for bit) and writes the rescue row (all K) and the packed row (the best N of
  them, a 16-bit radix select on ord16, ties taken in ascending id order), both B' rows with
  slots in ascending local id. In a step it writes them as 8-byte units (each word with the
  step's tag) and also pushes the packed row into every peer's buffer; no flag, no fence.
- Merge: on CUDA tensors the CuTe kernel of ``kernels/dcp_merge.py``; here ``_dcp_merge``, its
  Triton twin with the same arguments and results, which the CPU interpreter runs in CI (and
  bench_dcp.py times beside it). One program per row, after a bounded wait until every unit of
  the row's W rows carries the step's tag. The sent rows sit in registers; eight counting steps
  (two bits each) find t16, the ord16 of the K-th candidate; the selection is every candidate above t16 plus the
  lowest global ids at t16. A full row whose lowest ord16 is >= t16 may hold deeper candidates
  (saturated); if any, t16 is found again over a streamed candidate set with their rescue rows
  (read from their buffers through an address table) in place of their sent rows. Ids come out
  ascending whatever the slot order of the B' rows: candidates set bits of two scratch bitmaps
  (above t16, at t16), and one scan of their popcounts gives each id its slot and each tie its
  rank. A test points the address table at W local buffers to simulate W ranks.

Why Triton for the pack and the merge's twin: per-row passes with no cluster or distributed
shared memory to manage, and Triton runs them on CPU tensors under TRITON_INTERPRET=1, so CI checks
them (and the whole exchange step over simulated ranks) bit for bit against the reference. The
merge that ships on the GPU is CuTe DSL: it is a chain of CTA-wide steps, and in Triton each of
them is a block-wide reduction (16.3 us a row against 5.6, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import reference
from ..dcp_config import (
    GROUPS,
    LOCAL_INDEX_BITS,
    dcp_merge_local_topk,
    dcp_topk_merge_fits,
    packed_row_words,
    rescue_row_slots,
    workspace_words,
)

CHUNK = tl.constexpr(2048)  # B' slots streamed per step of a merge pass
NO_WAIT = tl.constexpr(0x7FFFFFFFFFFFFFFF)  # state[3] while no wait of the step has begun
WORD_CHUNK = tl.constexpr(4096)  # bitmap words (2**17 global ids) per step of the merge's output scan
MERGE_WARPS = 8  # warps per Triton merge program (one row)
# The merge on CUDA tensors: "cute" (kernels/dcp_merge.py, shipped) or "triton" (``_dcp_merge``,
# which the CPU interpreter runs in CI); bench_dcp.py times both.
MERGE_KERNEL = "cute"


@triton.jit
def _ord16(x):
    """The seed's ord16 of scores rounded to bf16 (nearest even), NaN as -inf, -0.0 as +0.0.

    Integer arithmetic on the bits only: the same result compiled and in the CPU interpreter."""
    if x.dtype == tl.bfloat16:
        b = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = tl.where((b & 0x7FFF) > 0x7F80, 0xFF80, b)  # NaN -> -inf
    else:
        bits = x.to(tl.int32, bitcast=True)
        b = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
        b = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0xFF80, b)  # NaN -> -inf
    b = tl.where(b == 0x8000, 0, b)  # -0.0 -> +0.0
    return tl.where(b >= 0x8000, 0xFFFF - b, b | 0x8000)


@triton.jit
def _peer(peers, r):
    """Rank r's buffer (int32) from the address table."""
    return tl.load(peers + r).to(tl.pointer_type(tl.int32))


@triton.jit
def _high_planes(first, end, planes):
    """Plane words of B' slots whose local id has bit 16 set, given that these are the slots in
    [first, end) (ids ascend, so they come last): word p holds slots 32p..32p+31."""
    lo = tl.minimum(tl.maximum(first - 32 * planes, 0), 32).to(tl.int64)
    hi = tl.minimum(tl.maximum(end - 32 * planes, 0), 32).to(tl.int64)
    return ((1 << hi) - (1 << lo)).to(tl.int32)  # bits lo..hi-1 (the cast keeps the low 32 bits)


# The K-th largest of 16-bit keys (-1 = no key), two bits per step: one block-wide sum counts the
# keys at or above three candidates at once (21-bit fields of an int64), so 16 bits take eight
# dependent sums. Block-wide steps are what a row's latency is made of (H200, 4096 keys, 8 warps:
# 2 x 256-bin tl.histogram 5.5 us, 16 single-count bisection steps 4.0 us).
FIELD = tl.constexpr(21)
FIELD2 = tl.constexpr(42)
FIELD_MASK = tl.constexpr((1 << 21) - 1)


@triton.jit
def _ge_counts(k16, t16, shift):
    """Keys >= t16 | (d << shift) for d = 1, 2, 3, packed in 21-bit fields (summed over the keys)."""
    c = (k16 >= (t16 | (1 << shift))).to(tl.int64)
    c |= (k16 >= (t16 | (2 << shift))).to(tl.int64) << FIELD
    c |= (k16 >= (t16 | (3 << shift))).to(tl.int64) << FIELD2
    return tl.sum(c)


@triton.jit
def _kth16_step(counts, t16, upper, shift, need):
    """The next two bits of the threshold from ``_ge_counts``: the largest d whose candidate still
    has ``need`` keys at or above it. ``upper``: the keys at or above the next candidate up (at
    the end, the keys strictly above the threshold)."""
    n1 = (counts & FIELD_MASK).to(tl.int32)
    n2 = ((counts >> FIELD) & FIELD_MASK).to(tl.int32)
    n3 = ((counts >> FIELD2) & FIELD_MASK).to(tl.int32)
    d = (n1 >= need).to(tl.int32) + (n2 >= need).to(tl.int32) + (n3 >= need).to(tl.int32)
    upper = tl.where(d == 0, n1, tl.where(d == 1, n2, tl.where(d == 2, n3, upper)))
    return t16 | (d << shift), upper


@triton.jit
def _store_words(out, at, word, mask, tag, TAGGED: tl.constexpr):
    """``out[at] = word``; TAGGED (a step's rows): 8-byte units ``out[2 at] = word, out[2 at + 1] =
    tag`` instead, each one store, so a reader that sees the step's tag sees the word with it."""
    if TAGGED:
        unit = (tag.to(tl.int64) << 32) | (word.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out.to(tl.pointer_type(tl.int64)) + at, unit, mask=mask)
    else:
        tl.store(out + at, word, mask=mask)


@triton.jit
def _store_packed(out, pos, word, take, slot, need, planes, plane_words, tag, N: tl.constexpr,
                  TAGGED: tl.constexpr):
    """A packed B' row: the taken words at their positions, zero slots after ``need``, the planes
    (every slot and plane written, so a tagged row is whole once every unit has the tag). Tagged,
    the planes are stored after every thread's slots: the merge polls the last plane unit first,
    and units issued earlier mostly land earlier (it still checks every unit's tag)."""
    _store_words(out, pos, word, take, tag, TAGGED)
    _store_words(out, slot, tl.zeros_like(slot), (slot >= need) & (slot < N), tag, TAGGED)
    if TAGGED:
        tl.debug_barrier()
    _store_words(out, N + planes, plane_words, planes < N // 32, tag, TAGGED)


@triton.jit(do_not_specialize=["scores_stride"], do_not_specialize_on_alignment=["scores"])
def _pack_rows(ids, ids_stride, scores, scores_stride, packed, packed_stride, rescue, rescue_stride,
               state, peers, rank, push_offset, parity_packed, parity_rescue,
               K: tl.constexpr, N: tl.constexpr, R: tl.constexpr, SLOTS: tl.constexpr,
               W: tl.constexpr, EXCHANGE: tl.constexpr, EARLY_MERGE: tl.constexpr = False):
    """B' rows of one rank: ``rescue`` = all of its local top-K, ``packed`` = the best N of them.

    ``ids`` holds the local top-K ascending (-1 padded), so slots come out in ascending local id,
    and among equal ord16 the first ones in the row are the lower ids (the merge's tie order).
    EXCHANGE: both rows go to this rank's symmetric buffer at the step's parity, then the packed
    row is stored into every peer's buffer (same offset), every word as an 8-byte unit tagged
    with the step's tag (``_step_tag``): no flag and no release fence (a system-scope fence waits for
    the remote stores' round trip); readers poll the tags. EARLY_MERGE: the step's merge
    (launched as a programmatic dependent) may start now; it orders itself by the tags."""
    if EARLY_MERGE:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    tag = 0
    if EXCHANGE:
        seq = tl.load(state)
        parity = seq & 1
        tag = _step_tag(seq)
        packed += parity * parity_packed
        rescue += parity * parity_rescue
    slot = tl.arange(0, SLOTS)
    local = tl.load(ids + row * ids_stride + slot, mask=slot < K, other=-1)
    live = local >= 0
    ord16 = _ord16(tl.load(scores + row * scores_stride + local, mask=live, other=0.0))
    word = tl.where(live, (ord16 << 16) | (0xFFFF - (local & 0xFFFF)), 0)
    low = local < (1 << 16)  # bit 16 clear (the plane bit)
    planes = tl.arange(0, SLOTS // 32)
    _store_words(rescue + row * rescue_stride, slot, word, slot < R, tag, EXCHANGE)
    rescue_planes = _high_planes(tl.sum((live & low).to(tl.int32)), tl.sum(live.to(tl.int32)), planes)
    _store_words(rescue + row * rescue_stride, R + planes, rescue_planes, planes < R // 32, tag, EXCHANGE)

    # The best N: ord16's threshold two bits at a time, then the ties in row order.
    key16 = tl.where(live, ord16, -1)
    need = tl.minimum(tl.sum(live.to(tl.int32)), N)
    t16 = tl.zeros((), dtype=tl.int32)
    above = tl.zeros((), dtype=tl.int32)
    for step in tl.static_range(8):
        shift = 14 - 2 * step
        t16, above = _kth16_step(_ge_counts(key16, t16, shift), t16, above, shift, need)
    rest = need - above
    # One scan counts both the keys above t16 and the ties (16 bits each); the first `rest` ties are taken.
    ties = live & (ord16 == t16)
    both = tl.cumsum((live & (ord16 > t16)).to(tl.int32) | (ties.to(tl.int32) << 16), 0)
    take = live & ((ord16 > t16) | (ties & ((both >> 16) <= rest)))
    pos = (both & 0xFFFF) + tl.minimum(both >> 16, rest) - 1
    packed_planes = _high_planes(tl.sum((take & low).to(tl.int32)), need, planes)
    row_at = row * packed_stride
    _store_packed(packed + row_at, pos, word, take, slot, need, planes, packed_planes, tag, N, EXCHANGE)
    if EXCHANGE:  # the same units into every peer's buffer
        at = push_offset + parity * parity_packed + row_at
        for q in range(W):
            if q != rank:
                _store_packed(_peer(peers, q) + at, pos, word, take, slot, need, planes, packed_planes, tag, N,
                              True)


# --------------------------------------------------------------------------------- merge
#
# A row's selection is "every candidate with ord16 > t16, and the `ties` lowest global ids among
# those with ord16 == t16": eight counting steps find t16 (the ord16 of the K-th candidate); the
# global-id tie break and the ascending output both come from two bitmaps over global ids
# (S: ord16 > t16, T: ord16 == t16) and one scan of their packed popcounts. A selected id's slot
# is (S ids below it) + min(T ids below it, ties). Few block-wide steps: the merge is latency bound.
# The sent rows of a row's W ranks (W * N <= 8192 keys) are held in registers; with saturated
# ranks the candidate set (their rescue rows in place of their sent rows, up to ~23K keys) is
# streamed from memory in chunks instead. Each phase works on (ord16, global id) tensors of any
# shape, so both drivers share it.


@triton.jit
def _merge_keys(row, slots, j, rank, inside, W: tl.constexpr, UNIT: tl.constexpr):
    """(ord16, or -1 for an empty slot; global id) of slots ``j`` of B' rows (``row``, ``rank``
    broadcast); UNIT: int32 words per slot (2 in a step's tagged rows, the tags already checked)."""
    word = tl.load(row + UNIT * j, mask=inside, other=0)
    plane = tl.load(row + UNIT * (slots + j // 32), mask=inside, other=0)
    local = (0xFFFF - (word & 0xFFFF)) | (((plane >> (j % 32)) & 1) << 16)
    return tl.where(word != 0, (word >> 16) & 0xFFFF, -1), local * W + rank


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter has no PTX: the same count in SWAR

    @triton.jit
    def _popcount(x):
        """Set bits of each 32-bit word."""
        x = x.to(tl.uint32, bitcast=True)
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return ((x * 0x01010101) >> 24).to(tl.int32, bitcast=True)

else:

    @triton.jit
    def _popcount(x):
        """Set bits of each 32-bit word (one popc instruction)."""
        return tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [x.to(tl.int32, bitcast=True)],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _sent_keys(sent, sent_rank_stride, W: tl.constexpr, WP2: tl.constexpr, N: tl.constexpr, NP2: tl.constexpr,
               UNIT: tl.constexpr):
    """Every rank's sent (ord16, global id) of the row as [WP2, NP2] (ord16 -1 outside)."""
    rank = tl.arange(0, WP2)[:, None]
    j = tl.arange(0, NP2)[None, :]
    return _merge_keys(sent + rank * sent_rank_stride, N, j, rank, (rank < W) & (j < N), W, UNIT)


@triton.jit
def _flag(mask, r):
    """Element r of a per-rank mask, as a scalar."""
    ranks = tl.arange(0, mask.shape[0])
    return tl.sum(tl.where(ranks == r, mask, 0)) != 0


@triton.jit
def _candidates(sent, sent_rank_stride, peers, rescue_at, r, saturated, N: tl.constexpr, R: tl.constexpr):
    """Rank r's candidate row: its sent row, or its rescue row (read from its buffer) if saturated."""
    if saturated:
        base = _peer(peers, r) + rescue_at
    else:
        base = sent + r * sent_rank_stride
    return base, tl.where(saturated, R, N)


@triton.jit
def _chunk_keys(base, slots, start, r, W: tl.constexpr, UNIT: tl.constexpr):
    """(ord16, global id) of rank r's candidate slots start .. start + CHUNK - 1 (``_merge_keys``)."""
    j = start + tl.arange(0, CHUNK)
    return _merge_keys(base, slots, j, r, j < slots, W, UNIT)


@triton.jit
def _candidate_counts(k16, sent, sent_rank_stride, peers, rescue_at, sat, t16, SHIFT: tl.constexpr,
                      W: tl.constexpr, N: tl.constexpr, R: tl.constexpr, REGS: tl.constexpr, UNIT: tl.constexpr):
    """``_ge_counts`` over the row's candidates (SHIFT < 0: the live ones): ``k16`` (REGS), else
    every rank's sent or rescue row, streamed."""
    if REGS:
        counts = _live_or_ge_counts(k16, t16, SHIFT)
    else:
        counts = tl.zeros((), dtype=tl.int64)
        for r in range(W):
            base, slots = _candidates(sent, sent_rank_stride, peers, rescue_at, r, _flag(sat, r), N, R)
            for start in range(0, slots, CHUNK):
                keys = _chunk_keys(base, slots, start, r, W, UNIT)[0]
                counts += _live_or_ge_counts(keys, t16, SHIFT)
    return counts


@triton.jit
def _live_or_ge_counts(k16, t16, SHIFT: tl.constexpr):
    """``_ge_counts``, or (SHIFT < 0) the number of keys (the threshold's first step)."""
    if SHIFT >= 0:
        counts = _ge_counts(k16, t16, SHIFT)
    else:
        counts = tl.sum((k16 >= 0).to(tl.int64))
    return counts


@triton.jit
def _threshold(k16, sent, sent_rank_stride, peers, rescue_at, sat, K,
               W: tl.constexpr, N: tl.constexpr, R: tl.constexpr, REGS: tl.constexpr, UNIT: tl.constexpr):
    """(t16, ties, count): the ord16 of the K-th best candidate (of the last one if fewer are live),
    how many of the candidates at t16 are taken, and how many are taken in all."""
    live = _candidate_counts(k16, sent, sent_rank_stride, peers, rescue_at, sat, 0, -1, W, N, R, REGS, UNIT)
    need = tl.minimum(live, K).to(tl.int32)
    t16 = tl.zeros((), dtype=tl.int32)
    above = tl.zeros((), dtype=tl.int32)
    for step in tl.static_range(8):
        shift = 14 - 2 * step
        counts = _candidate_counts(k16, sent, sent_rank_stride, peers, rescue_at, sat, t16, shift, W, N, R, REGS,
                                   UNIT)
        t16, above = _kth16_step(counts, t16, above, shift, need)
    return t16, need - above, need


@triton.jit
def _top_id(k16, gid, t16):
    return tl.max(tl.where((k16 >= 0) & (k16 >= t16), gid, 0))


@triton.jit
def _set_bits(k16, gid, t16, strict, ties):
    """Candidates above t16 set their bit in ``strict``, those at t16 in ``ties``."""
    word = tl.where(k16 > t16, strict, ties) + (gid >> 5)
    tl.atomic_or(word, 1 << (gid & 31), mask=(k16 >= 0) & (k16 >= t16), sem="relaxed")


@triton.jit
def _store_ranked(k16, gid, t16, ties, bits, prefix, start, out):
    """Each selected id whose bitmap word is in the chunk at ``start`` at its rank among the
    selected: (S ids below it) + min(T ids below it, ties), gathered from the chunk's words
    (``bits`` = S | T << 32) and exclusive prefix counts (``prefix`` = S | T << 15)."""
    w = (gid >> 5) - start
    maybe = (k16 >= 0) & (k16 >= t16) & (w >= 0) & (w < bits.shape[0])
    w = tl.where(maybe, w, 0)
    words = tl.gather(bits, w, 0)
    counts = tl.gather(prefix, w, 0)
    below = (1 << (gid & 31)) - 1
    s_rank = (counts & 0x7FFF) + _popcount(words.to(tl.int32) & below)
    t_rank = ((counts >> 15) & 0x1FFFF) + _popcount((words >> 32).to(tl.int32) & below)
    chosen = maybe & ((k16 > t16) | (t_rank < ties))
    tl.store(out + s_rank + tl.minimum(t_rank, ties), gid, mask=chosen)


@triton.jit
def _emit(k16, gid, sent, sent_rank_stride, peers, rescue_at, sat, t16, ties, scratch, out,
          W: tl.constexpr, N: tl.constexpr, R: tl.constexpr, WORDS: tl.constexpr, REGS: tl.constexpr,
          UNIT: tl.constexpr):
    """The selected global ids, ascending, into ``out``, whatever the slot order of the rows:
    candidates at or above t16 set bits of S or T (scratch, all zero between calls), and per chunk
    of words (one up to 2**17 global ids) the words are read back and cleared, scanned into packed
    prefix counts, and each selected id of the chunk lands at its rank."""
    strict = scratch
    tied = scratch + WORDS
    if REGS:
        top = _top_id(k16, gid, t16)
        _set_bits(k16, gid, t16, strict, tied)
    else:
        top = tl.zeros((), dtype=tl.int32)
        for r in range(W):
            base, slots = _candidates(sent, sent_rank_stride, peers, rescue_at, r, _flag(sat, r), N, R)
            for start in range(0, slots, CHUNK):
                k, g = _chunk_keys(base, slots, start, r, W, UNIT)
                top = tl.maximum(top, _top_id(k, g, t16))
                _set_bits(k, g, t16, strict, tied)
    tl.debug_barrier()  # every bit is set (relaxed atomics; the barrier orders them) before the counts
    words = (top >> 5) + 1
    below = tl.zeros((), dtype=tl.int32)
    for first in range(0, words, WORD_CHUNK):
        w = first + tl.arange(0, WORD_CHUNK)
        s_bits = tl.load(strict + w, mask=w < words, other=0, cache_modifier=".cg")  # atomics land in L2
        t_bits = tl.load(tied + w, mask=w < words, other=0, cache_modifier=".cg")
        tl.store(strict + w, tl.zeros_like(w), mask=w < words)  # zero again for the next call
        tl.store(tied + w, tl.zeros_like(w), mask=w < words)
        # S counts <= K < 2**15 in the low bits, T counts < 2**17 above (the sum may wrap: masked on read).
        counts = _popcount(s_bits) + (_popcount(t_bits) << 15)
        inclusive = tl.cumsum(counts, 0)
        prefix = below + inclusive - counts
        bits = (s_bits.to(tl.int64) & 0xFFFFFFFF) | (t_bits.to(tl.int64) << 32)
        if REGS:
            _store_ranked(k16, gid, t16, ties, bits, prefix, first, out)
        else:
            for r in range(W):
                base, slots = _candidates(sent, sent_rank_stride, peers, rescue_at, r, _flag(sat, r), N, R)
                for start in range(0, slots, CHUNK):
                    k, g = _chunk_keys(base, slots, start, r, W, UNIT)
                    _store_ranked(k, g, t16, ties, bits, prefix, first, out)
        below += tl.sum(counts)


@triton.jit
def _merge_row(sent, sent_rank_stride, peers, rescue_at, scratch, global_ids, local_ids, local_count, K, rank,
               want, timeout_ns, state, W: tl.constexpr, WP2: tl.constexpr, N: tl.constexpr, NP2: tl.constexpr,
               R: tl.constexpr, KP2: tl.constexpr, WORDS: tl.constexpr, UNIT: tl.constexpr):
    """Merge one row: ``sent`` = its [W, words] B' rows, rank r's rescue row at ``peers[r] + rescue_at``;
    ``scratch`` = 2 * WORDS words (zero), the outputs already offset to the row. UNIT == 2: a
    step's tagged rows (the sent ones arrived; a saturated rank's rescue row is waited for with
    ``want`` and ``timeout_ns``). The error word's bits of the rows that did not arrive (then
    nothing is written), else 0."""
    k16, gid = _sent_keys(sent, sent_rank_stride, W, WP2, N, NP2, UNIT)
    nobody = tl.arange(0, WP2) < 0
    flat16 = tl.reshape(k16, (WP2 * NP2,))
    flat_gid = tl.reshape(gid, (WP2 * NP2,))
    t16, ties, count = _threshold(flat16, sent, sent_rank_stride, peers, rescue_at, nobody, K, W, N, R, True, UNIT)

    # Saturated (may hold deeper candidates of the top K): a full row of N whose lowest key is at
    # or above t16. Counting the ranks at t16 keeps this a superset of the exact test (the lowest
    # key above the K-th), and rescuing a rank that did not need it is exact, only slower.
    lowest = tl.min(tl.where(tl.arange(0, NP2)[None, :] < N, k16, 1 << 16), axis=1)
    sat = (lowest >= t16) & (count > 0)
    error = tl.full((), 0, tl.int32)
    if tl.sum(sat.to(tl.int32)) > 0:
        if UNIT == 2:
            for r in range(W):
                if _flag(sat, r):
                    error |= _error_bits(_wait_row(_peer(peers, r) + rescue_at, R + R // 32, want, timeout_ns, state), r)
        if error == 0:
            t16, ties, count = _threshold(flat16, sent, sent_rank_stride, peers, rescue_at, sat, K, W, N, R, False,
                                          UNIT)
            _emit(flat16, flat_gid, sent, sent_rank_stride, peers, rescue_at, sat, t16, ties, scratch, global_ids,
                  W, N, R, WORDS, False, UNIT)
    else:
        _emit(flat16, flat_gid, sent, sent_rank_stride, peers, rescue_at, sat, t16, ties, scratch, global_ids,
              W, N, R, WORDS, True, UNIT)
    if error == 0:
        _finish_row(global_ids, local_ids, local_count, count, K, rank, W, KP2)
    return error


@triton.jit
def _finish_row(global_ids, local_ids, local_count, count, K, rank, W: tl.constexpr, KP2: tl.constexpr):
    """The global ids' padding, then this rank's local ids (read back from the global ids)."""
    slot = tl.arange(0, KP2)
    tl.store(global_ids + slot, tl.full((KP2,), -1, tl.int32), mask=(slot >= count) & (slot < K))
    tl.debug_barrier()  # the global ids are in memory before this rank's own are read back

    ids = tl.load(global_ids + slot, mask=slot < count, other=-1)
    mine = (slot < count) & (ids % W == rank)
    pos = tl.cumsum(mine.to(tl.int32), 0) - 1
    n_mine = tl.sum(mine.to(tl.int32))
    tl.store(local_ids + pos, ids // W, mask=mine)
    tl.store(local_ids + slot, tl.full((KP2,), -1, tl.int32), mask=(slot >= n_mine) & (slot < K))
    tl.store(local_count, n_mine)


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _step_tag(seq):
    """A step's tag: its sequence number (15 bits) and its row count (the grid), never 0, so a
    reader tells a unit of this step from one of an earlier step or of a peer's step of other rows."""
    return (((seq & 0x7FFF) << 16) | tl.num_programs(0)).to(tl.int32)


# A unit's arrival: ARRIVED, LATE (not yet there, or the wait ran out), OTHER_ROWS (of this step
# but sent by a peer whose step has another row count: no wait makes it right).
ARRIVED = tl.constexpr(0)
LATE = tl.constexpr(1)
OTHER_ROWS = tl.constexpr(2)


@triton.jit
def _arrival(units, mask, want):
    """The arrival of the (masked) tagged units at ``units`` (int32 word pointers), tag ``want``."""
    tags = tl.load(units + 1, mask=mask, other=want, volatile=True)
    other_rows = ((tags >> 16) == (want >> 16)) & ((tags & 0xFFFF) != 0) & (tags != want)
    missing = tl.sum((tags != want).to(tl.int32))
    return tl.where(tl.sum(other_rows.to(tl.int32)) > 0, OTHER_ROWS, tl.where(missing > 0, LATE, ARRIVED))


@triton.jit
def _wait_row(row, units, want, timeout_ns, state):
    """Poll a tagged row's first ``units`` units until each carries ``want``, for at most
    ``timeout_ns`` after the step's first wait began (``state[3]``, so one bound holds for the whole
    step however many rows and ranks wait): its arrival (ARRIVED, LATE or OTHER_ROWS)."""
    arrival = tl.full((), 0, tl.int32)
    for start in range(0, units, CHUNK):
        at = row + 2 * (start + tl.arange(0, CHUNK))
        inside = start + tl.arange(0, CHUNK) < units
        seen = _arrival(at, inside, want)
        if (seen == LATE) & (timeout_ns > 0):  # the clock is read only when waiting (the CPU interpreter has none)
            now = _now()
            begin = tl.minimum(tl.atomic_min(state + 3, now), now)
            while (seen == LATE) & (_now() - begin < timeout_ns):
                seen = _arrival(at, inside, want)
        arrival = tl.maximum(arrival, seen)
    return arrival


@triton.jit
def _error_bits(arrival, r):
    """The error word's bits for rank r's arrival: bit r late, bit 16 + r another row count."""
    return tl.where(arrival == OTHER_ROWS, 1 << (16 + r), tl.where(arrival == LATE, 1 << r, 0))


@triton.jit
def _advance_step(state):
    """The last row's program to finish advances the step (every program has read the sequence
    by then) and clears the step's first wait time."""
    if tl.atomic_add(state + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.store(state + 1, 0)
        tl.store(state + 3, NO_WAIT)
        tl.store(state, tl.load(state) + 1)


@triton.jit
def _dcp_merge(gathered, gathered_rank_stride, gathered_row_stride, peers, rescue_offset, rescue_row_stride,
               scratch, scratch_stride, global_ids, local_ids, out_stride, local_count, K, rank,
               state, parity_gathered, parity_rescue, timeout_ns,
               W: tl.constexpr, WP2: tl.constexpr, N: tl.constexpr, NP2: tl.constexpr, R: tl.constexpr,
               KP2: tl.constexpr, WORDS: tl.constexpr, EXCHANGE: tl.constexpr):
    """One program per row. EXCHANGE: the rows sit in this rank's symmetric buffer at the step's
    parity as tagged units; wait (bounded) until every rank's row of this row carries the step's
    tag, merge, and the last program advances the step. A row whose rows did not arrive gets no
    ids (-1, count 0), and ``state[2]`` records which ranks' (``_error_bits``)."""
    row = tl.program_id(0).to(tl.int64)
    global_ids += row * out_stride
    local_ids += row * out_stride
    local_count += row
    sent = gathered + row * gathered_row_stride
    error = tl.full((), 0, tl.int32)
    want = 0
    if EXCHANGE:
        seq = tl.load(state)
        parity = seq & 1
        sent += parity * parity_gathered
        rescue_at = rescue_offset + parity * parity_rescue + row * rescue_row_stride
        want = _step_tag(seq)
        for r in range(W):
            error |= _error_bits(_wait_row(sent + r * gathered_rank_stride, N + N // 32, want, timeout_ns, state), r)
        tl.debug_barrier()  # every thread reads the rows after they were seen
    else:
        rescue_at = row * rescue_row_stride
    if error == 0:
        error = _merge_row(sent, gathered_rank_stride, peers, rescue_at, scratch + row * scratch_stride, global_ids,
                           local_ids, local_count, K, rank, want, timeout_ns, state, W, WP2, N, NP2, R, KP2, WORDS,
                           2 if EXCHANGE else 1)
    if error != 0:
        slot = tl.arange(0, KP2)
        tl.store(global_ids + slot, tl.full((KP2,), -1, tl.int32), mask=slot < K)
        tl.store(local_ids + slot, tl.full((KP2,), -1, tl.int32), mask=slot < K)
        tl.store(local_count, 0)
        tl.atomic_or(state + 2, error.to(tl.int64))
    if EXCHANGE:
        _advance_step(state)


# ------------------------------------------------------------------------------- launching


def pack_rows(ids: torch.Tensor, scores: torch.Tensor, packed: torch.Tensor, rescue: torch.Tensor) -> None:
    """B' rows from the local top-K ``ids`` (ascending, -1 padded) of ``scores``."""
    rows, topk = ids.shape
    n = packed.shape[1] * 32 // 33
    slots = rescue_row_slots(topk)
    if rows:
        _pack_rows[(rows,)](
            ids, ids.stride(0), scores, scores.stride(0), packed, packed.stride(0), rescue, rescue.stride(0),
            ids, ids, 0, 0, 0, 0,
            K=topk, N=n, R=slots, SLOTS=max(triton.next_power_of_2(slots), 32), W=1, EXCHANGE=False, num_warps=8,
        )


def merge_rows(gathered: torch.Tensor, peers: torch.Tensor, rescue_row_stride: int, topk: int, rank: int,
               global_ids: torch.Tensor, local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """One-round merge of ``gathered`` [W, T, words]; rank r's rescue rows start at ``peers[r]``."""
    world_size, rows, words = gathered.shape
    if not rows:
        return
    n = words * 32 // 33
    if _cute_merge(gathered):
        from .dcp_merge import compiled

        gathered = gathered.contiguous()
        compiled(world_size, topk, False)(
            gathered.view(-1), gathered.stride(0), gathered.stride(1), peers, 0, rescue_row_stride, global_ids,
            local_ids, local_count, rank, peers, 0, 0, 0)
        return
    kp2 = triton.next_power_of_2(topk)
    bitmap_words = _bitmap_words(world_size)
    scratch = torch.zeros(rows, 2 * bitmap_words, dtype=torch.int32, device=gathered.device)
    _dcp_merge[(rows,)](
        gathered, gathered.stride(0), gathered.stride(1), peers, 0, rescue_row_stride,
        scratch, scratch.stride(0), global_ids, local_ids, global_ids.stride(0), local_count, topk, rank,
        peers, 0, 0, 0,
        W=world_size, WP2=triton.next_power_of_2(world_size), N=n,
        NP2=triton.next_power_of_2(n), R=rescue_row_slots(topk), KP2=kp2, WORDS=bitmap_words, EXCHANGE=False,
        num_warps=MERGE_WARPS,
    )


def _cute_merge(t: torch.Tensor) -> bool:
    """Whether the merge of rows on ``t``'s device is the CuTe kernel (CUDA), else the Triton one."""
    return t.is_cuda and MERGE_KERNEL == "cute"


def stacked_peers(rescue: torch.Tensor) -> torch.Tensor:
    """The address table of a stacked [W, T, words] rescue tensor (one rank per slice)."""
    step = rescue.stride(0) * rescue.element_size()
    return torch.arange(rescue.shape[0], dtype=torch.int64, device=rescue.device) * step + rescue.data_ptr()


def dcp_pack(scores, lengths, world_size, rank, topk, packed, rescue) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_pack`` (arguments already checked)."""
    ids = torch.empty(scores.shape[0], topk, dtype=torch.int32, device=scores.device)
    local_topk_ids(scores, lengths, ids)
    pack_rows(ids, scores, packed, rescue)


def dcp_merge(gathered, rescue, topk, rank, global_ids, local_ids, local_count) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_merge`` (arguments already checked)."""
    merge_rows(gathered, stacked_peers(rescue), rescue.stride(1), topk, rank, global_ids, local_ids, local_count)


def warm_step(world_size: int, topk: int) -> None:
    """Compile every kernel variant a one-round step of (W, K) can take, from fake tensors: the
    engine's ord16 selection at each cluster size and score dtype, and the step's merge. (The
    pack, one Triton variant per score dtype, compiles in ``init_dcp_topk_merge``'s warm steps.)"""
    from . import topk as engine
    from .dcp_merge import compiled

    for ranks in engine.CLUSTER_SIZES:
        for dtype in (torch.float32, torch.bfloat16):
            engine.compiled(dtype, False, ranks, ord16=True)
    if MERGE_KERNEL == "cute":
        compiled(world_size, topk, True)


def warm(device: torch.device) -> None:
    """Compile the simulated pack and merge at the decode shape (W = 2, K = 2048, fp32 and bf16).
    A group's one-round step compiles in ``init_dcp_topk_merge`` (``warm_step``)."""
    world_size, topk, width = 2, 2048, 4096
    n = dcp_merge_local_topk(topk, world_size)
    lengths = torch.full((1,), width, dtype=torch.int32, device=device)
    for dtype in (torch.float32, torch.bfloat16):
        scores = torch.zeros(1, width, dtype=dtype, device=device)
        packed = torch.empty(world_size, 1, packed_row_words(n), dtype=torch.int32, device=device)
        rescue = torch.empty(world_size, 1, packed_row_words(rescue_row_slots(topk)), dtype=torch.int32, device=device)
        for rank in range(world_size):
            dcp_pack(scores, lengths, world_size, rank, topk, packed[rank], rescue[rank])
        ids = torch.empty(2, 1, topk, dtype=torch.int32, device=device)
        dcp_merge(packed, rescue, topk, 0, ids[0], ids[1], torch.empty(1, dtype=torch.int32, device=device))


# -------------------------------------------------------------------- symmetric-memory step

def dcp_topk_merge(scores, lengths, topk, group_name, global_ids, local_ids, local_count) -> None:
    """The CUDA kernel of ``sparse_decode::dcp_topk_merge``: the one-round step where the group has
    a workspace and the step fits it (a shape test, the same on every rank), else the generic merge."""
    state = GROUPS.get((group_name, topk))
    ws = state.workspace if state is not None else None
    rows, width = scores.shape
    if ws is not None and dcp_topk_merge_fits(rows, topk, ws.local_topk, group_name) and width <= ws.max_local_len:
        one_round_step(ws, scores, lengths, global_ids, local_ids, local_count)
    else:
        reference.dcp_topk_merge(scores, lengths, topk, group_name, global_ids, local_ids, local_count)


class Workspace:
    """One DCP group's one-round state for one topk, built collectively by ``make_workspace``.

    This rank's symmetric buffer holds (int32 words, the same layout on every rank), each B' word
    as an 8-byte unit (the word, then the step's tag ``(seq & 0x7FFFFFFF) + 1``, stored at once):
    ``exchange [2 parities][W ranks][max_rows][2 * packed words]`` (peers push their packed rows
    here), ``rescue [2][max_rows][2 * rescue words]`` (this rank's local top-K, read by peers).
    A reader knows a unit of the step has arrived when it carries the step's tag (the buffer
    starts zeroed; a tag is never 0 and a parity's tag changes every other step). ``state`` (local
    int64) holds the step sequence, the rows merged so far this step, the error word (``error``)
    and when the step's first wait began (the step's waits end ``timeout_s`` after it). The
    kernels advance the sequence, so CUDA graph replays walk the parities too."""

    def __init__(self, group_name: str, buffer: torch.Tensor, buffers: list[int], world_size: int, rank: int,
                 topk: int, local_topk: int, max_rows: int, timeout_s: float, handle=None,
                 max_local_len: int = 1 << LOCAL_INDEX_BITS):
        """``buffers``: every rank's address of its buffer (``buffers[rank] == buffer.data_ptr()``)."""
        self.group_name, self.world_size, self.rank = group_name, world_size, rank
        self.topk, self.local_topk, self.max_rows = topk, local_topk, max_rows
        self.timeout_ns = int(timeout_s * 1e9)
        self.buffer, self.handle = buffer, handle
        # int32 words of a tagged packed / rescue row
        self.packed_words = 2 * packed_row_words(local_topk)
        self.rescue_words = 2 * packed_row_words(rescue_row_slots(topk))
        self.exchange_parity = world_size * max_rows * self.packed_words
        self.rescue_parity = max_rows * self.rescue_words
        self.rescue_offset = 2 * self.exchange_parity
        device = buffer.device
        self.peers = torch.tensor(buffers, dtype=torch.int64, device=device)
        self.state = torch.tensor([0, 0, 0, NO_WAIT.value], dtype=torch.int64, device=device)
        self.exchange = buffer[: self.rescue_offset]
        self.own_rows = buffer[rank * max_rows * self.packed_words:]
        self.rescue = buffer[self.rescue_offset:]
        # Per-step scratch, owned here so that a step allocates nothing: the local top-K ids, and
        # the Triton merge's bitmaps (the CuTe merge keeps its own in shared memory).
        self.ids = torch.empty(max_rows, topk, dtype=torch.int32, device=device)
        self.max_local_len = max_local_len  # the widest step that takes the one-round path
        self.bitmap_words = _bitmap_words(world_size, max_local_len)
        self.scratch = None
        if not _cute_merge(self.ids):
            self.triton_scratch()

    words = staticmethod(workspace_words)

    def triton_scratch(self) -> torch.Tensor:
        """The Triton merge's bitmaps (zero between steps), made on first use."""
        if self.scratch is None:
            self.scratch = torch.zeros(self.max_rows, 2 * self.bitmap_words, dtype=torch.int32,
                                       device=self.buffer.device)
        return self.scratch

    def take_error(self) -> int:
        """The error word since the last call, then cleared (host sync: call outside captured
        steps): bit r, rank r's rows did not arrive in time; bit 16 + r, rank r's step had
        another row count."""
        error = int(self.state[2].item()) & 0xFFFFFFFF
        if error:
            self.state[2] = 0
        return error


def _bitmap_words(world_size: int, local_len: int = 1 << LOCAL_INDEX_BITS) -> int:
    return -(-world_size * local_len // 32)  # a bit per possible global id (l * W + r, l < local_len)


def make_workspace(group_name: str, world_size: int, rank: int, topk: int, local_topk: int, max_rows: int,
                   device: torch.device, timeout_s: float, max_local_len: int) -> Workspace:
    """Collective: allocate and rendezvous the symmetric buffer, zero it, and sync the group."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch.distributed.distributed_c10d import _resolve_process_group

    words = Workspace.words(world_size, topk, local_topk, max_rows)
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before rendezvous on older torch
        symm_mem.enable_symm_mem_for_group(group_name)
    buffer = symm_mem.empty(words, dtype=torch.int32, device=device)
    handle = symm_mem.rendezvous(buffer, group_name)
    buffer.zero_()
    torch.cuda.synchronize(device)
    dist.barrier(group=_resolve_process_group(group_name))
    # The tensor may start inside its symmetric allocation: the same offset on every rank.
    offset = buffer.data_ptr() - handle.buffer_ptrs[rank]
    buffers = [ptr + offset for ptr in handle.buffer_ptrs]
    return Workspace(group_name, buffer, buffers, world_size, rank, topk, local_topk, max_rows, timeout_s, handle,
                     max_local_len)


def one_round_step(ws: Workspace, scores: torch.Tensor, lengths: torch.Tensor, global_ids: torch.Tensor,
                   local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """Pack, push, wait, merge: the whole one-round step on this rank (rows <= ws.max_rows)."""
    rows = scores.shape[0]
    if rows == 0:
        return
    ids = ws.ids[:rows]
    local_topk_ids(scores, lengths, ids)
    push_rows(ws, ids, scores)
    merge_step(ws, global_ids, local_ids, local_count)


def local_topk_ids(scores: torch.Tensor, lengths: torch.Tensor, ids: torch.Tensor) -> None:
    """The rank's local top-K (``ids.shape[1]``) by bf16 ord16 (the CuTe engine), ids ascending, -1 padded."""
    from .topk import select_ord16

    if scores.shape[1]:
        select_ord16(scores, lengths, ids.shape[1], ids)
    else:
        ids.fill_(-1)


def push_rows(ws: Workspace, ids: torch.Tensor, scores: torch.Tensor) -> None:
    """This rank's B' rows of the step from its local top-K ``ids`` into every rank's buffer."""
    slots = rescue_row_slots(ws.topk)
    _pack_rows[(ids.shape[0],)](
        ids, ids.stride(0), scores, scores.stride(0), ws.own_rows, ws.packed_words, ws.rescue, ws.rescue_words,
        ws.state, ws.peers, ws.rank, ws.rank * ws.max_rows * ws.packed_words, ws.exchange_parity, ws.rescue_parity,
        K=ws.topk, N=ws.local_topk, R=slots, SLOTS=max(triton.next_power_of_2(slots), 32), W=ws.world_size,
        EXCHANGE=True, EARLY_MERGE=_cute_merge(ids), num_warps=8,
    )


def merge_step(ws: Workspace, global_ids: torch.Tensor, local_ids: torch.Tensor, local_count: torch.Tensor) -> None:
    """Wait for every rank's rows of the step, merge them, advance the step."""
    w = ws.world_size
    if _cute_merge(global_ids):
        from .dcp_merge import compiled

        compiled(w, ws.topk, True)(
            ws.exchange, ws.max_rows * ws.packed_words, ws.packed_words, ws.peers, ws.rescue_offset, ws.rescue_words,
            global_ids, local_ids, local_count, ws.rank, ws.state, ws.exchange_parity, ws.rescue_parity, ws.timeout_ns)
        return
    _dcp_merge[(global_ids.shape[0],)](
        ws.exchange, ws.max_rows * ws.packed_words, ws.packed_words, ws.peers, ws.rescue_offset, ws.rescue_words,
        ws.triton_scratch(), ws.bitmap_words * 2, global_ids, local_ids, global_ids.stride(0), local_count, ws.topk,
        ws.rank, ws.state, ws.exchange_parity, ws.rescue_parity, ws.timeout_ns,
        W=w, WP2=triton.next_power_of_2(w), N=ws.local_topk, NP2=triton.next_power_of_2(ws.local_topk),
        R=rescue_row_slots(ws.topk),
        KP2=triton.next_power_of_2(ws.topk), WORDS=ws.bitmap_words, EXCHANGE=True, num_warps=MERGE_WARPS,
    )
