"""The Triton twin of the DCP one-round merge (``merge_kernel``): the same arguments and results as
the CuTe merge that ships (``ops/dcp/merge.py``), run by the CPU interpreter in CI (the merge
and the whole exchange step over simulated ranks, bit for bit against the reference) and timed
beside it by bench_dcp.py.

One program per row, after a bounded wait until every unit of the row's W rows carries the
step's tag. The sent rows sit in registers; eight counting steps (two bits each) find t16, the
ord16 of the K-th candidate; the selection is every candidate above t16 plus the lowest global ids
at t16. A full row whose lowest ord16 is >= t16 may hold deeper candidates (saturated); if any,
t16 is found again over a streamed candidate set with their rescue rows (read from their buffers
through an address table) in place of their sent rows. Ids come out ascending whatever the slot
order of the B' rows: candidates set bits of two scratch bitmaps (above t16, at t16), and one scan
of their popcounts gives each id its slot and each tie its rank. A test points the address table
at W local buffers to simulate W ranks.

Why it is not the one that ships: the merge is a chain of CTA-wide steps, and in Triton each of
them is a block-wide reduction (16.3 us a row against 5.6 on the H200).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from . import config
from .config import LOCAL_INDEX_BITS
from .pack import TAG_ROWS_BITS, TAG_ROWS_MASK, ge_counts, kth16_step, peer_buffer, step_tag

CHUNK = tl.constexpr(2048)  # B' slots streamed per step of a merge pass
NO_WAIT = tl.constexpr(config.NO_WAIT)
WORD_CHUNK = tl.constexpr(4096)  # bitmap words (2**17 global ids) per step of the merge's output scan
MERGE_WARPS = 8  # warps per Triton merge program (one row)


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
        base = peer_buffer(peers, r) + rescue_at
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
    """``ge_counts`` over the row's candidates (SHIFT < 0: the live ones): ``k16`` (REGS), else
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
    """``ge_counts``, or (SHIFT < 0) the number of keys (the threshold's first step)."""
    if SHIFT >= 0:
        counts = ge_counts(k16, t16, SHIFT)
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
        t16, above = kth16_step(counts, t16, above, shift, need)
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
                    rescued = peer_buffer(peers, r) + rescue_at
                    error |= error_bits(wait_row(rescued, R + R // 32, want, timeout_ns, state), r)
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


# A unit's arrival: ARRIVED, LATE (not yet there, or the wait ran out), OTHER_ROWS (of this step
# but sent by a peer whose step has another row count: no wait makes it right).
ARRIVED = tl.constexpr(0)
LATE = tl.constexpr(1)
OTHER_ROWS = tl.constexpr(2)


@triton.jit
def _arrival(units, mask, want):
    """The arrival of the (masked) tagged units at ``units`` (int32 word pointers), tag ``want``."""
    tags = tl.load(units + 1, mask=mask, other=want, volatile=True)
    of_step = (tags >> TAG_ROWS_BITS) == (want >> TAG_ROWS_BITS)
    other_rows = of_step & ((tags & TAG_ROWS_MASK) != 0) & (tags != want)
    missing = tl.sum((tags != want).to(tl.int32))
    return tl.where(tl.sum(other_rows.to(tl.int32)) > 0, OTHER_ROWS, tl.where(missing > 0, LATE, ARRIVED))


@triton.jit
def wait_row(row, units, want, timeout_ns, state):
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
def error_bits(arrival, r):
    """The error word's bits for rank r's arrival: bit r late, bit 16 + r another row count."""
    return tl.where(arrival == OTHER_ROWS, 1 << (16 + r), tl.where(arrival == LATE, 1 << r, 0))


@triton.jit
def advance_step(state):
    """The last row's program to finish advances the step (every program has read the sequence
    by then) and clears the step's first wait time."""
    if tl.atomic_add(state + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.store(state + 1, 0)
        tl.store(state + 3, NO_WAIT)
        tl.store(state, tl.load(state) + 1)


@triton.jit
def merge_kernel(gathered, gathered_rank_stride, gathered_row_stride, peers, rescue_offset, rescue_row_stride,
               scratch, scratch_stride, global_ids, local_ids, out_stride, local_count, K, rank,
               state, parity_gathered, parity_rescue, timeout_ns,
               W: tl.constexpr, WP2: tl.constexpr, N: tl.constexpr, NP2: tl.constexpr, R: tl.constexpr,
               KP2: tl.constexpr, WORDS: tl.constexpr, EXCHANGE: tl.constexpr):
    """One program per row. EXCHANGE: the rows sit in this rank's symmetric buffer at the step's
    parity as tagged units; wait (bounded) until every rank's row of this row carries the step's
    tag, merge, and the last program advances the step. A row whose rows did not arrive gets no
    ids (-1, count 0), and ``state[2]`` records which ranks' (``error_bits``)."""
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
        want = step_tag(seq)
        for r in range(W):
            error |= error_bits(wait_row(sent + r * gathered_rank_stride, N + N // 32, want, timeout_ns, state), r)
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
        advance_step(state)


def bitmap_words(world_size: int, local_len: int = 1 << LOCAL_INDEX_BITS) -> int:
    """int32 words of one of the Triton merge's two bitmaps over a row's global ids."""
    return -(-world_size * local_len // 32)  # a bit per possible global id (l * W + r, l < local_len)
