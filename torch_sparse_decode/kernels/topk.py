"""CUDA kernels of ``select_candidate_blocks`` and ``indexer_topk``: one exact top-k engine (Triton).

Design: a tree of chunk-local exact selections, each level one launch over (rows, chunks).

- Level 1 reads each row's valid prefix once (chunks past it exit at once, so work follows the
  valid length, not the padded width), turns scores into int32 keys in the library order (NaN as
  -inf, -0.0 as +0.0, the fp32 bits with the negative range flipped so signed order is score
  order) and, for blocks, takes each block's max on the fly.
- Every chunk of up to 8K keys keeps exactly its own top-k: the k-th largest key t built bit by
  bit (32 block-wide counts), every key > t, and the first ``k - #(> t)`` keys equal to t in
  index order (a cumulative sum, only when ties straddle t), so ties of any size stay exact.
  Survivors are compacted in index order (another cumulative sum).
- The survivors of all chunks of a row form the next level's row; a level of one chunk is final
  and writes the ids. Index order is kept at every level, so the output is ascending without a
  sort; the pinned newest block is appended after the others (it has the largest id).

Why Triton: the engine is block-wide reductions and scans over register tiles, which Triton
expresses directly and runs under TRITON_INTERPRET=1 on the CPU (CI tests the same kernels).
Why a tree rather than one cluster kernel: every level is exact on its own and reads its input
once; the cost is one launch per level (2 to 5) and the chunk-local threshold search.

Measured (H200, benchmarks/RESULTS.md): exact, 1.3-5.4x faster than block max + torch.topk for
blocks, but the search's 32 dependent block-wide reductions (~0.3-0.6 us each in Triton) make
every level cost 8-20 us, far from the one-read floor; indexer_topk runs 0.5-1.3x the speed of
(tie-inexact) torch.topk.
Reaching the floor needs shared-memory radix histograms with few barriers (a CuTe DSL cluster
kernel); this engine is the exact baseline that one must match bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 8192  # keys (or block columns) one program holds in registers
EMPTY = tl.constexpr(-(1 << 31))  # below every real key (the key of -inf is -0x7F800001)
NUM_WARPS = 8  # with CHUNK: the best of 4-32 warps x 4K-16K keys on the H200


@triton.jit
def _ordered_key(x):
    """int32 key of fp32 scores in the library order; signed comparison is score order."""
    x = tl.where(x != x, float("-inf"), x)
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 ties +0.0
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _select_chunk(
    src, src_ids, src_stride, lengths, ends, width,
    dst_keys, dst_ids, dst_stride, dst_lengths,
    out, out_stride, k_sel, k_out,
    MODE: tl.constexpr,  # 0: scores, 1: block logits, 2: keys + ids of an earlier level
    BLOCK: tl.constexpr, BLOCK_P2: tl.constexpr, PINNED: tl.constexpr,
    C: tl.constexpr, KEEP: tl.constexpr, FINAL: tl.constexpr, OUT_P2: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    # Valid keys of this row's input (for blocks: all valid blocks but the pinned newest).
    n_in = tl.load(lengths + row)
    n_cols = n_in
    if MODE != 2:
        n_cols = tl.minimum(tl.maximum(n_in, 0), width)
        n_in = n_cols
    if MODE == 1:
        n_in = (n_cols + BLOCK - 1) // BLOCK
        if PINNED:
            n_in = tl.maximum(n_in - 1, 0)
    if not FINAL:
        if chunk == 0:
            tl.store(dst_lengths + row, tl.cdiv(n_in, C) * KEEP)
    start = chunk * C
    if (start < n_in) | FINAL:
        offs = start + tl.arange(0, C)
        valid = offs < n_in
        row_src = src + row.to(tl.int64) * src_stride
        ids = offs
        if MODE == 0:
            x = tl.load(row_src + offs, mask=valid, other=0.0).to(tl.float32)
            keys = tl.where(valid, _ordered_key(x), EMPTY)
        elif MODE == 1:
            cols = offs[:, None] * BLOCK + tl.arange(0, BLOCK_P2)[None, :]
            inside = valid[:, None] & (cols < n_cols) & (tl.arange(0, BLOCK_P2)[None, :] < BLOCK)
            x = tl.load(row_src + cols, mask=inside, other=float("-inf"))
            x = tl.where(x != x, float("-inf"), x)
            keys = tl.where(valid, _ordered_key(tl.max(x, axis=1)), EMPTY)
        else:
            keys = tl.load(row_src + offs, mask=valid, other=EMPTY)
            ids = tl.load(src_ids + row.to(tl.int64) * src_stride + offs, mask=valid, other=0)

        live = keys != EMPTY
        selected = live
        if tl.sum(live.to(tl.int32)) > k_sel:
            # The k_sel-th largest key, bit by bit from the top on unsigned keys (EMPTY -> 0):
            # t grows while at least k_sel keys are >= it. 32-bit compares only.
            u = (keys ^ -2147483648).to(tl.uint32, bitcast=True)
            t = tl.full((), 0, tl.uint32)
            for i in tl.static_range(32):
                probe = t | tl.full((), 1 << (31 - i), tl.uint32)
                if tl.sum((u >= probe).to(tl.int32)) >= k_sel:
                    t = probe
            above = u > t
            tied = u == t
            need = k_sel - tl.sum(above.to(tl.int32))
            selected = above | tied
            if need < tl.sum(tied.to(tl.int32)):  # ties at t: the lowest ids first
                selected = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= need))
        slot = tl.cumsum(selected.to(tl.int32), axis=0) - 1
        count = tl.sum(selected.to(tl.int32))
        if FINAL:
            row_out = out + row.to(tl.int64) * out_stride
            tl.store(row_out + slot, ids, mask=selected)
            if PINNED:
                blocks = tl.cdiv(tl.minimum(tl.maximum(tl.load(ends + row), 0), width), BLOCK)
                if blocks > 0:
                    tl.store(row_out + count, blocks - 1)
                    count += 1
            pad = tl.arange(0, OUT_P2)
            tl.store(row_out + pad, tl.full([OUT_P2], -1, tl.int32), mask=(pad >= count) & (pad < k_out))
        else:
            base = row.to(tl.int64) * dst_stride + chunk * KEEP
            tl.store(dst_keys + base + slot, keys, mask=selected)
            tl.store(dst_ids + base + slot, ids, mask=selected)
            rest = tl.arange(0, KEEP)
            tl.store(dst_keys + base + rest, tl.full([KEEP], EMPTY, tl.int32), mask=rest >= count)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def plan(first_keys: int, first_chunk: int, k_sel: int) -> list[tuple[int, int, int]]:
    """Static levels [(input keys, chunk, keep per chunk)]; the last has one chunk (final).

    Chunks after the first hold at least 4x what they keep, so every level shrinks the row 4x."""
    levels, n, chunk = [], first_keys, first_chunk
    while True:
        if n <= chunk:
            levels.append((n, max(_next_pow2(n), 16), k_sel))
            return levels
        keep = min(_next_pow2(k_sel), chunk)
        levels.append((n, chunk, keep))
        n, chunk = -(-n // chunk) * keep, max(CHUNK, 4 * keep)


def levels_for(mode: int, width: int, block: int, k_sel: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(block_p2, levels) of one call: the launch sequence is a function of static shapes only."""
    if mode == 1:
        block_p2 = _next_pow2(block)
        return block_p2, plan(-(-width // block), CHUNK // block_p2, k_sel)
    return 1, plan(width, max(CHUNK, 4 * _next_pow2(k_sel)), k_sel)


def _run(source, lengths, k_out: int, k_sel: int, out: torch.Tensor, mode: int, block: int) -> None:
    rows, width = source.shape
    if rows == 0:
        return
    block_p2, levels = levels_for(mode, width, block, k_sel)
    src, src_ids, src_stride, src_lengths = source, source, source.stride(0), lengths
    cur_mode = mode
    for level, (n, chunk, keep) in enumerate(levels):
        final = level == len(levels) - 1
        chunks = 1 if final else -(-n // chunk)
        if final:
            dst_keys = dst_ids = dst_lengths = out
            dst_stride = 0
        else:
            dst_keys = torch.empty(rows, chunks * keep, dtype=torch.int32, device=source.device)
            dst_ids = torch.empty_like(dst_keys)
            dst_lengths = torch.empty(rows, dtype=torch.int32, device=source.device)
            dst_stride = dst_keys.stride(0)
        _select_chunk[(rows, chunks)](
            src, src_ids, src_stride, src_lengths, lengths, width,
            dst_keys, dst_ids, dst_stride, dst_lengths,
            out, out.stride(0), k_sel, k_out,
            MODE=cur_mode, BLOCK=block, BLOCK_P2=block_p2, PINNED=mode == 1,
            C=chunk, KEEP=keep, FINAL=final, OUT_P2=max(_next_pow2(k_out), 2),
            num_warps=NUM_WARPS,
        )
        src, src_ids, src_stride, src_lengths = dst_keys, dst_ids, dst_stride, dst_lengths
        cur_mode = 2


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """The CUDA kernel of ``sparse_decode::indexer_topk`` (arguments already checked)."""
    _run(scores, lengths, k, k, out, mode=0, block=1)


def select_candidate_blocks(logits: torch.Tensor, row_ends: torch.Tensor, block_size: int, out: torch.Tensor) -> None:
    """The CUDA kernel of ``sparse_decode::select_candidate_blocks`` (arguments already checked)."""
    k = out.shape[1]
    _run(logits, row_ends, k, k - 1, out, mode=1, block=block_size)


def warm(device: torch.device) -> None:
    """Compile the decode shapes' kernels (Triton caches them per constexpr configuration)."""
    for width in (32768, 131072, 1 << 20):
        x = torch.zeros(1, width, device=device)
        n = torch.full((1,), width, dtype=torch.int32, device=device)
        out = torch.empty(1, 2048, dtype=torch.int32, device=device)
        indexer_topk(x, n, 2048, out)
        for block in (8, 64):
            select_candidate_blocks(x, n, block, out)
