"""The DCP pack (Triton): a rank's B' rows from its local top-K, as ``dcp_pack`` and a step's push.

The top-k engine (``kernels/topk``, keyed by each score's bf16 ord16) selects the rank's local
top-K, ties to the lower local id (the merge's order), ids ascending; ``pack_kernel`` recomputes
their ord16 (bf16 rounding on the bits, so the CPU interpreter and the GPU agree bit for bit) and
writes the rescue row (all K) and the packed row (the best N of them, a 16-bit radix select on
ord16, ties taken in ascending id order), both B' rows with slots in ascending local id. In a step
it writes them as 8-byte units (each word with the step's tag) and also pushes the packed row into
every peer's buffer; no flag, no fence.

Why Triton: a per-row pass with no cluster or distributed shared memory to manage, which Triton
runs on CPU tensors under TRITON_INTERPRET=1, so CI checks it bit for bit against the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import pdl
from ...kernels.triton_order import ord16 as bf16_ord16
from . import config
from .config import packed_row_slots, rescue_row_slots

# The step tag's layout (config), as the kernels read it.
TAG_SEQ_MASK = tl.constexpr(config.TAG_SEQ_MASK)
TAG_ROWS_BITS = tl.constexpr(config.TAG_ROWS_BITS)
TAG_ROWS_MASK = tl.constexpr(config.TAG_ROWS_MASK)


@triton.jit
def peer_buffer(peers, r):
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
def ge_counts(k16, t16, shift):
    """Keys >= t16 | (d << shift) for d = 1, 2, 3, packed in 21-bit fields (summed over the keys)."""
    c = (k16 >= (t16 | (1 << shift))).to(tl.int64)
    c |= (k16 >= (t16 | (2 << shift))).to(tl.int64) << FIELD
    c |= (k16 >= (t16 | (3 << shift))).to(tl.int64) << FIELD2
    return tl.sum(c)


@triton.jit
def kth16_step(counts, t16, upper, shift, need):
    """The next two bits of the threshold from ``ge_counts``: the largest d whose candidate still
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
def pack_kernel(ids, ids_stride, scores, scores_stride, packed, packed_stride, rescue, rescue_stride,
               state, peers, rank, push_offset, parity_packed, parity_rescue,
               K: tl.constexpr, N: tl.constexpr, R: tl.constexpr, SLOTS: tl.constexpr,
               W: tl.constexpr, EXCHANGE: tl.constexpr, EARLY_MERGE: tl.constexpr = False, PDL: tl.constexpr = False):
    """B' rows of one rank: ``rescue`` = all of its local top-K, ``packed`` = the best N of them.

    ``ids`` holds the local top-K ascending (-1 padded), so slots come out in ascending local id,
    and among equal ord16 the first ones in the row are the lower ids (the merge's tie order).
    EXCHANGE: both rows go to this rank's symmetric buffer at the step's parity, then the packed
    row is stored into every peer's buffer (same offset), every word as an 8-byte unit tagged
    with the step's tag (``step_tag``): no flag and no release fence (a system-scope fence waits for
    the remote stores' round trip); readers poll the tags. EARLY_MERGE: the step's merge
    (launched as a programmatic dependent) may start now; it orders itself by the tags. PDL: this
    kernel is a programmatic dependent of the local select that writes ``ids``, and waits for it."""
    if EARLY_MERGE:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:
        tl.extra.cuda.gdc_wait()
        if not EARLY_MERGE:
            tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    tag = 0
    if EXCHANGE:
        seq = tl.load(state)
        parity = seq & 1
        tag = step_tag(seq)
        packed += parity * parity_packed
        rescue += parity * parity_rescue
    slot = tl.arange(0, SLOTS)
    local = tl.load(ids + row * ids_stride + slot, mask=slot < K, other=-1)
    live = local >= 0
    ord16 = bf16_ord16(tl.load(scores + row * scores_stride + local, mask=live, other=0.0))
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
        t16, above = kth16_step(ge_counts(key16, t16, shift), t16, above, shift, need)
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
                _store_packed(peer_buffer(peers, q) + at, pos, word, take, slot, need, planes, packed_planes, tag, N,
                              True)


@triton.jit
def step_tag(seq):
    """A step's tag (``config.TAG_SEQ_MASK``): its sequence number and its row count (the grid)."""
    return (((seq & TAG_SEQ_MASK) << TAG_ROWS_BITS) | tl.num_programs(0)).to(tl.int32)


def pack_rows(ids: torch.Tensor, scores: torch.Tensor, packed: torch.Tensor, rescue: torch.Tensor) -> None:
    """B' rows from the local top-K ``ids`` (ascending, -1 padded) of ``scores``."""
    rows, topk = ids.shape
    n = packed_row_slots(packed.shape[1])
    slots = rescue_row_slots(topk)
    if rows:
        dependent = pdl.enabled(pdl.DCP)
        pack_kernel[(rows,)](
            ids, ids.stride(0), scores, scores.stride(0), packed, packed.stride(0), rescue, rescue.stride(0),
            ids, ids, 0, 0, 0, 0,
            K=topk, N=n, R=slots, SLOTS=max(triton.next_power_of_2(slots), 32), W=1, EXCHANGE=False,
            PDL=dependent, num_warps=8, launch_pdl=dependent,
        )
