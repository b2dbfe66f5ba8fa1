"""The short-row select by counting (Triton): the top-k of a row whose window holds at most
COUNT_MAX keys, one program per row, with no histogram and no atomics.

- The row's window is read once into registers as 32-bit keys whose unsigned order is the library
  order (NaN as -inf, -0.0 as +0.0); columns past the window are 0, below every real key. bf16
  and fp16 scores widen to fp32 exactly; the key's low bits that a 16-bit score never sets (16
  for bf16, 13 for fp16, all 1 for negative scores) are cleared, so fewer steps cover them.
- The k-th largest key t is found 4 bits a step, top first: each step counts the keys >= each
  of the 16 values the next digit can give (one compare and one reduction of 16 counts over the
  row) and keeps the largest whose count is still >= k. t is then the largest key with k keys at
  or above it: exact, whatever the distribution, in a fixed number of steps (8 for fp32, 5 for
  fp16, 4 for bf16). The CuTe short-row path (``short_row``) spends its time in histogram atomics
  (about 0.8 us of each 1.6-us round on the H200); counting needs none.
- Output: keys > t, and the first ``k - count(> t)`` keys == t in index order (a scan), each at
  its place among the kept (a second scan): ids ascending, ties to the lowest ids, no sort. A row
  of at most k keys keeps them all, unread (its keys all 0: all tied at t = 0), then -1.
- Block keys (``select_candidate_blocks``): the block-key pass's keys, already in unsigned order
  (8 steps), the newest block pinned after the best k of the others, as the engine writes it.
- The DCP pack's local select (``select_ord16``): fp32 and bf16 scores keyed by their bf16 ord16
  (``kernels/triton_order.py``) in the top 16 bits, 4 steps, ties to the lower id.
- Fused outputs (``indexer_topk_fused``, ``select_candidate_blocks_fused``; a FUSED build reads
  them at run time, as the engine's ``Outputs``): each kept id goes to ``out`` through the page
  or block table where ``page`` > 0, with bit 1 of ``want`` to ``raw`` too, with bit 2 its score
  to ``values`` (then the row is read even where it keeps every key); padding -1, -1 and -inf.

Opt-in (TORCH_SPARSE_DECODE_COUNT_SELECT=1) until it has run on the GPU: exact in the CPU
interpreter, not yet timed. ``launch.select`` takes it for rows of at most COUNT_MAX scores
(``indexer_topk``) or block keys (a shape test: graph-safe, and exact like the engine, so a row's
ids never depend on the other rows).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import pdl
from ..triton_order import ord16 as bf16_ord16

COUNT_SELECT = os.environ.get("TORCH_SPARSE_DECODE_COUNT_SELECT", "0") == "1"
COUNT_MAX = 16384  # the widest window the path takes
MIN_BLOCK = 2048  # narrower batches are read as this many columns (masked): few builds to warm
KEYS_PER_THREAD = 8  # up to the widest window (16 there: 32 warps at most)
STEP_BITS = 4
_STEP_BITS = tl.constexpr(STEP_BITS)  # as the kernel reads them
_DIGITS = tl.constexpr(1 << STEP_BITS)
# Steps by source (see the module docstring): scores by dtype, block keys (int32) all 32 bits;
# scores keyed by their bf16 ord16 (the DCP pack's local select), 16 bits.
STEPS = {torch.float32: 8, torch.float16: 5, torch.bfloat16: 4, torch.int32: 8}
ORD16_STEPS = 4
ORD16_SCORES = (torch.float32, torch.bfloat16)
# The keys' bits the steps cover (the rest are cleared), by steps.
KEY_MASKS = {steps: (0xFFFFFFFF << (32 - STEP_BITS * steps)) & 0xFFFFFFFF for steps in {*STEPS.values(), ORD16_STEPS}}


@triton.jit
def _slots(table, table_stride, row, page, ids, mask):
    """The KV slots of ``ids`` through the row's table (``page`` > 0: ``table[row, id // page] *
    page + id % page``), else the ids."""
    p = tl.maximum(page, 1)
    paged = (ids * 0 + page) > 0  # a block, not a scalar: the interpreter takes no scalar in a mask
    base = tl.load(table + row.to(tl.int64) * table_stride + ids // p, mask=mask & paged, other=0)
    return tl.where(paged, base * p + ids % p, ids)


@triton.jit
def _store_fused(out, raw, values, table, table_stride, row, page, want, at, ids, score, mask,
                 VALUES: tl.constexpr):
    """The fused outputs of ids ``ids`` (with VALUES, of scores ``score``) at slots ``at`` of the row."""
    wants = ids * 0 + want  # a block, not a scalar: the interpreter takes no scalar in a mask
    tl.store(out + at, _slots(table, table_stride, row, page, ids, mask), mask=mask)
    tl.store(raw + at, ids, mask=mask & ((wants & 1) != 0))
    if VALUES:
        tl.store(values + at, score, mask=mask & ((wants & 2) != 0))


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


if pdl.INTERPRETED:  # the interpreter runs a combine function in Python, per element

    @triton.jit
    def _sum4(a, b, c, d):
        return tl.sum(a, 0), tl.sum(b, 0), tl.sum(c, 0), tl.sum(d, 0)
else:

    @triton.jit
    def _sum4(a, b, c, d):
        return tl.reduce((a, b, c, d), 0, _add4)  # one reduction: its barriers shared by the four


FIELDS = tl.constexpr(0x0001000100010001)  # 1 in each 16-bit field of an int64 (its low bit)
LOW_THREE = tl.constexpr(0x0000000100010001)


@triton.jit
def _next_digit(key, t, shift: tl.constexpr, k):
    """The largest digit d (0 .. 15) such that at least k keys are >= t + (d << shift), given that
    the keys below t are never counted (0 when fewer than k keys are >= t + (1 << shift)).

    One reduction over the row: each key >= t falls in bin min((key - t) >> shift, 15), the keys
    below t in bin 0 (never read); bin b is 16-bit field (15 - b) % 4 of int64 (15 - b) // 4, so
    the four sums hold the bins from the top down (a bin holds at most COUNT_MAX < 2**15 keys).
    Shifted adds turn each int64 into running counts from bin 15 down, a field per bin; adding
    0x8000 - k to every field sets its bit 15 where the count is >= k (no field carries). The
    counts fall as d grows, so d is the number of such fields among bins 1 .. 15. (A sum per
    digit, then a max over the digits, cost twice the barriers: 10 a step.)"""
    d = tl.where(key >= t, tl.minimum((key - t) >> shift, 15), 0).to(tl.int32)
    slot = 15 - d
    one = tl.full(d.shape, 1, tl.int64) << ((slot & 3) * 16).to(tl.int64)
    quad = slot >> 2
    s0, s1, s2, s3 = _sum4(tl.where(quad == 0, one, 0), tl.where(quad == 1, one, 0), tl.where(quad == 2, one, 0),
                           tl.where(quad == 3, one, 0))
    c0 = s0 + (s0 << 16) + (s0 << 32) + (s0 << 48)  # bins 15, 15..14, 15..13, 15..12
    c1 = s1 + (s1 << 16) + (s1 << 32) + (s1 << 48) + (c0 >> 48) * FIELDS
    c2 = s2 + (s2 << 16) + (s2 << 32) + (s2 << 48) + (c1 >> 48) * FIELDS
    c3 = s3 + (s3 << 16) + (s3 << 32) + (s3 << 48) + (c2 >> 48) * FIELDS  # its top field: bin 0
    bias = (0x8000 - k).to(tl.int64) * FIELDS
    ge = (((c0 + bias) >> 15) & FIELDS) + (((c1 + bias) >> 15) & FIELDS) + \
        (((c2 + bias) >> 15) & FIELDS) + (((c3 + bias) >> 15) & LOW_THREE)
    return ((ge + (ge << 16) + (ge << 32) + (ge << 48)) >> 48).to(tl.int32)


@triton.jit(do_not_specialize=["src_stride", "cols", "block", "k", "out_stride", "table_stride", "page", "want"],
            do_not_specialize_on_alignment=["out", "raw", "values", "table"])
def _count_select(src, src_stride, lengths, starts, cols, block, k, out, out_stride, raw, values, table,
                  table_stride, page, want, WINDOWED: tl.constexpr, PINNED: tl.constexpr, BLOCK: tl.constexpr,
                  STEPS: tl.constexpr, KEY_MASK: tl.constexpr, PDL: tl.constexpr = False,
                  FUSED: tl.constexpr = False, ORD16: tl.constexpr = False):
    if PDL:  # a programmatic dependent: the keys and lengths may come from the kernel before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    end = tl.minimum(tl.maximum(tl.load(lengths + row), 0), cols)
    first = 0
    if WINDOWED:
        first = tl.minimum(tl.maximum(tl.load(starts + row), 0), end)
    row_src = src + row.to(tl.int64) * src_stride
    if PINNED:  # block keys from the window's first block; the newest block is pinned, not ranked
        valid_blocks = (end - first + block - 1) // block
        n = tl.maximum(valid_blocks - 1, 0)
    else:
        row_src += first
        n = end - first
    col = tl.arange(0, BLOCK)
    valid = col < n
    # A row of <= k keys keeps them all, unread (block keys: never written for such rows), unless
    # its values are asked for.
    limit = tl.where((n > k) & (k > 0), n, 0)
    if FUSED and not PINNED:
        limit = tl.where((want & 2) != 0, n, limit)
    read = col < limit
    if PINNED:
        key = tl.load(row_src + col, mask=read, other=0).to(tl.uint32, bitcast=True)
    elif ORD16:
        score = tl.load(row_src + col, mask=read, other=0.0)
        key = tl.where(read, bf16_ord16(score).to(tl.uint32) << 16, 0)
    else:
        score = tl.load(row_src + col, mask=read, other=0.0)
        x = score.to(tl.float32)
        x = tl.where(x != x, float("-inf"), x) + 0.0  # NaN as -inf; + 0.0: -0.0 as +0.0
        bits = x.to(tl.uint32, bitcast=True)
        key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)  # unsigned order = score order
        key = tl.where(read, key & KEY_MASK, 0)

    t = tl.zeros([1], tl.uint32)
    for step in tl.static_range(STEPS):
        shift = 32 - _STEP_BITS * (step + 1)
        t = t + (_next_digit(key, t, shift, k).to(tl.uint32) << shift)

    above = key > t
    tie = valid & (key == t)
    tie_rank = tl.cumsum(tie.to(tl.int32), axis=0) - tie.to(tl.int32)
    kept = valid & (above | (tie & (tie_rank < k - tl.sum(above.to(tl.int32), axis=0))))
    place = tl.cumsum(kept.to(tl.int32), axis=0) - kept.to(tl.int32)
    row_at = row.to(tl.int64) * out_stride
    row_out = out + row_at
    count = tl.minimum(n, k)
    width = k
    if FUSED:
        _store_fused(row_out, raw + row_at, values + row_at, table, table_stride, row, page, want, place, col,
                     key if PINNED else score, kept, not PINNED)
    else:
        tl.store(row_out + place, col, mask=kept)
    if PINNED:  # the newest block after the ranked ones, where the row has a block
        newest = tl.full([1], 0, tl.int32) + valid_blocks - 1
        if FUSED:
            _store_fused(row_out, raw + row_at, values + row_at, table, table_stride, row, page, want,
                         tl.full([1], 0, tl.int32) + count, newest, newest, newest >= 0, False)
        else:
            tl.store(row_out + count, valid_blocks - 1, mask=valid_blocks > 0)
        count += (valid_blocks > 0).to(tl.int32)
        width = k + 1
    for at in range(0, width, BLOCK):  # -1 past the kept ids (fused: -1, -1, -inf)
        slot = at + col
        pad = (slot >= count) & (slot < width)
        tl.store(row_out + slot, -1, mask=pad)
        if FUSED:
            wants = slot * 0 + want
            tl.store(raw + row_at + slot, -1, mask=pad & ((wants & 1) != 0))
            if not PINNED:
                tl.store(values + row_at + slot, tl.full([BLOCK], float("-inf"), values.dtype.element_ty),
                         mask=pad & ((wants & 2) != 0))


def block_for(cols: int) -> int:
    """The columns a program reads (masked past the window): a power of two, MIN_BLOCK..COUNT_MAX."""
    return max(triton.next_power_of_2(cols), MIN_BLOCK)


def takes(src: torch.Tensor, pinned: bool, ord16: bool) -> bool:
    """Whether a batch takes the count select (``COUNT_SELECT`` on): rows of at most COUNT_MAX
    scores, block keys (int32, ``pinned``) or scores keyed by their ord16 (fp32, bf16), ids alone
    or with the fused outputs. A shape test, the same in every replay."""
    return (COUNT_SELECT and src.shape[1] <= COUNT_MAX and src.dtype in STEPS
            and (src.dtype is torch.int32) == pinned and (not ord16 or src.dtype in ORD16_SCORES))


def count_select(src: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor | None, cols: int, k: int,
                 out: torch.Tensor, block: int = 1, pinned: bool = False, pdl: bool = False,
                 table: torch.Tensor | None = None, page: int = 0, raw: torch.Tensor | None = None,
                 values: torch.Tensor | None = None, ord16: bool = False) -> None:
    """Row r's best ``k`` ids of columns [starts[r], lengths[r]) (clamped to [0, cols]; without
    ``starts`` from 0), counted from the window's start, ascending, -1 padded. ``pinned``: ``src``
    holds block keys (unsigned order; the window's blocks of ``block`` columns from 0), the
    newest block follows the best ``k`` of the others, and ``out`` has k + 1 columns. ``pdl``:
    launched as a programmatic dependent of the kernel before (``kernels/pdl.py``). With
    ``table`` and ``page`` > 0, ``out`` gets each id through the table; ``raw`` the ids; ``values``
    (scores) the selected scores: each of ``out``'s shape and strides. ``ord16``: scores ranked by
    their bf16 ord16 (the DCP pack's local select; ties to the lower id)."""
    rows, width = out.shape[0], block_for(src.shape[1])
    fused = table is not None or raw is not None or values is not None
    want = int(raw is not None) | 2 * int(values is not None)
    steps = ORD16_STEPS if ord16 else STEPS[src.dtype]
    if rows:
        _count_select[(rows,)](
            src, src.stride(0), lengths, lengths if starts is None else starts, cols, block, k, out, out.stride(0),
            out if raw is None else raw, src if values is None else values, out if table is None else table,
            0 if table is None else table.stride(0), page if table is not None else 0, want,
            WINDOWED=starts is not None, PINNED=pinned, BLOCK=width, STEPS=steps, KEY_MASK=KEY_MASKS[steps], PDL=pdl,
            FUSED=fused, ORD16=ord16, num_warps=min(width // (32 * KEYS_PER_THREAD), 32),
            launch_pdl=pdl,
        )


def warm(device: torch.device, pinned: bool, ord16: bool = False) -> None:
    """Compile (``kernels/triton_cache``) or load each build the count select takes, where it is
    switched on: every width it reads, with and without windows and the fused outputs, for
    scores of each dtype or (``pinned``) block keys; ``ord16``: the DCP pack's local select's
    (scores keyed by their ord16, no window, ids alone)."""
    if not COUNT_SELECT:
        return
    lengths = torch.ones(1, dtype=torch.int32, device=device)
    out = torch.empty(1, 2048, dtype=torch.int32, device=device)
    width = MIN_BLOCK
    while width <= COUNT_MAX:
        if ord16:
            for dtype in ORD16_SCORES:
                count_select(torch.zeros(1, width, dtype=dtype, device=device), lengths, None, width, 2048, out,
                             pdl=pdl.enabled(), ord16=True)
            width *= 2
            continue
        for dtype in [d for d in STEPS if (d is torch.int32) == pinned]:
            src = torch.zeros(1, width, dtype=dtype, device=device)
            values = None if pinned else torch.empty(1, 2048, dtype=dtype, device=device)
            for starts in (None, lengths):
                for fused in ({}, dict(table=lengths.view(1, 1), page=1, raw=out.clone(), values=values)):
                    count_select(src, lengths, starts, 8 * width if pinned else width, 2047 if pinned else 2048,
                                 out, 8 if pinned else 1, pinned, pdl.enabled(), **fused)
        width *= 2
