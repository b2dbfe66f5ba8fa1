"""CUDA kernels of ``select_candidate_blocks`` and ``indexer_topk``: one exact top-k engine.

The engine (``RadixTopk``, CuTe DSL) selects the best ``k_sel`` of each row's first ``n`` keys and
writes their ids ascending, -1 padded, optionally followed by a pinned id (the newest block).

- A row is split over a thread-block cluster of S CTAs (S = 1..8 by row width and row count), each
  streaming a contiguous span of the row once (work follows the valid length, not the padded
  width). Keys are 32-bit, unsigned order = library order (NaN as -inf, -0.0 as +0.0); ids break
  ties, so the best ``k_sel`` keys are unique.
- Each CTA keeps a shared-memory buffer of candidates in index order. A tile's keys above the
  CTA's threshold are appended (ballot compaction keeps index order); when the buffer fills,
  a radix select (three 11/11/10-bit digits, shared-memory histograms, warp-aggregated so ties do
  not serialize the atomics) keeps its best ``k_sel`` and raises the threshold to the ``k_sel``-th
  key. Later keys equal to it lose to it on id, so the filter is a strict ``>``.
- The cluster then runs the same radix select over the union of its CTAs' lists, summing the
  histograms through distributed shared memory, and each CTA writes its share of the output at
  an offset from its predecessors' counts: ids come out ascending with no sort, ties at the
  threshold go to the lowest ids (counted across the cluster in rank order).

Block scores (``select_candidate_blocks``) are first reduced to one key per valid block by a small
Triton kernel (``_block_keys``, any block size); the engine then reads ``ceil(width / block_size)``
keys per row instead of the logits. Why CuTe DSL for the select: it needs shared-memory atomics,
warp votes and cluster barriers, none of which Triton exposes; why Triton for block keys: a 2-D
masked max over arbitrary block sizes is one line there, and it runs on the CPU interpreter.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, BFloat16, Float32, Int32, Uint32, Uint64

THREADS = 256
WARPS = THREADS // 32
PER = 16  # keys per thread per streamed tile
TILE = THREADS * PER
CAP = 8192  # candidate buffer (keys + ids in shared memory)
BINS = 2048
DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, bits) of the radix digits, most significant first
MAX_K = CAP - TILE  # after a select the buffer holds k_sel and must fit one more tile
MAX_CLUSTER = 8
SOURCES = {torch.float32: Float32, torch.bfloat16: BFloat16, torch.int32: Int32}


@cute.jit
def ordered_key(x: Float32) -> Uint32:
    """Unsigned key of an fp32 score in the library order; 0 is below every score (no key)."""
    bits = x.bitcast(Uint32)
    if x != x:
        bits = Uint32(0xFF800000)  # NaN ranks as -inf
    if bits == Uint32(0x80000000):
        bits = Uint32(0)  # -0.0 ties +0.0
    flip = Uint32(0x80000000)
    if (bits >> Uint32(31)) != Uint32(0):
        flip = Uint32(0xFFFFFFFF)
    return bits ^ flip


@cute.jit
def ballot_of(predicate) -> Uint32:
    return Uint32(cute.arch.vote_ballot_sync(predicate))


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
def cluster_sync(ranks: cutlass.Constexpr[int]):
    if cutlass.const_expr(ranks > 1):
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        cute.arch.sync_threads()


@cute.jit
def count_digit(hist: cute.Tensor, bin: Int32, live, lane: Int32):
    """``hist[bin] += 1`` for each live lane. The two most common bins of the warp are added once
    each by a leader (all-equal or tie-heavy rows would otherwise serialize on one address)."""
    remaining = ballot_of(live)
    for _ in cutlass.range_constexpr(2):
        if remaining != Uint32(0):
            lowest = remaining & ((remaining ^ Uint32(0xFFFFFFFF)) + Uint32(1))
            leader = Int32(cute.arch.popc(lowest - Uint32(1)))
            common = cute.arch.shuffle_sync(bin, offset=leader)
            same = ballot_of(bin == common) & remaining
            if lane == leader:
                cute.arch.atomic_add(hist.iterator + common, Int32(cute.arch.popc(same)))
            remaining = remaining & (same ^ Uint32(0xFFFFFFFF))
    if ((remaining >> Uint32(lane)) & Uint32(1)) != Uint32(0):
        cute.arch.atomic_add(hist.iterator + bin, Int32(1))


@cute.jit
def exclusive_scan(value: Int32, warp_sums: cute.Tensor, tid: Int32):
    """(sum of ``value`` over lower threads, sum over the CTA); a barrier on both sides."""
    lane, warp = tid % 32, tid // 32
    inclusive = value
    for s in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_up(inclusive, offset=1 << s)
        if lane >= (1 << s):
            inclusive = inclusive + other
    if lane == 31:
        warp_sums[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(WARPS):
        part = warp_sums[w]
        if w < warp:
            before = before + part
        total = total + part
    cute.arch.sync_threads()
    return before + inclusive - value, total


@cute.jit
def scan_counts(counts: cute.Tensor, used: cutlass.Constexpr[int], warp_sums: cute.Tensor, tid: Int32) -> Int32:
    """Replace per-(step, warp) counts by their exclusive prefix in (step, warp) order; the total."""
    cute.arch.sync_threads()
    mine = Int32(0)
    if tid < used:
        mine = counts[tid]
    before, total = exclusive_scan(mine, warp_sums, tid)
    if tid < used:
        counts[tid] = before
    cute.arch.sync_threads()
    return total


@cute.jit
def find_threshold(keys: cute.Tensor, n: Int32, need: Int32, hist: cute.Tensor, result: cute.Tensor,
                   warp_sums: cute.Tensor, tid: Int32, ranks: cutlass.Constexpr[int]):
    """(T, m): T is the ``need``-th largest key of ``keys[:n]`` over the cluster's ``ranks`` CTAs,
    m how many keys equal to T the best ``need`` take. Requires more than ``need`` keys.

    Loops stay rolled: this runs a few times per CTA, and unrolled straight-line code would be
    fetched from L2 instruction by instruction."""
    lane = tid % 32
    per = BINS // THREADS
    prefix = Uint32(0)
    for p in range(3):  # digits of 11, 11 and 10 bits, most significant first
        shift = max(Int32(21) - Int32(11) * p, Int32(0))
        digit_mask = (Uint32(1) << Uint32(11 - p // 2)) - Uint32(1)
        done_mask = Uint32((Uint64(0xFFFFFFFF) << Uint64(shift + 11 - p // 2)) & Uint64(0xFFFFFFFF))
        base = p * BINS
        for b in cutlass.range_constexpr(per):
            hist[base + b * THREADS + tid] = Int32(0)
        cute.arch.sync_threads()
        for m in range(0, (n + THREADS - 1) // THREADS):
            j = m * THREADS + tid
            key = Uint32(0)
            if j < n:
                key = keys[j]
            live = (j < n) & (((key ^ prefix) & done_mask) == Uint32(0))
            digit = Int32((key >> Uint32(shift)) & digit_mask)
            count_digit(hist, base + digit, live, lane)
        cluster_sync(ranks)
        # This thread's `per` bins, highest first, summed over the cluster.
        mine = Int32(0)
        counts = cute.make_rmem_tensor(per, Int32)
        for b in cutlass.range_constexpr(per):
            at = base + BINS - 1 - (tid * per + b)
            v = Int32(0)
            if cutlass.const_expr(ranks > 1):
                for r in range(ranks):
                    v = v + load_rank(hist, at, r)
            else:
                v = hist[at]
            counts[b] = v
            mine = mine + v
        above, _ = exclusive_scan(mine, warp_sums, tid)
        if (above < need) & (above + mine >= need):
            run = above
            found = Int32(0)
            for b in cutlass.range_constexpr(per):
                if (found == 0) & (run + counts[b] >= need):
                    result[0] = BINS - 1 - (tid * per + b)
                    result[1] = run
                    found = Int32(1)
                run = run + counts[b]
        cute.arch.sync_threads()
        prefix = prefix | (Uint32(result[0]) << Uint32(shift))
        need = need - result[1]
        cute.arch.sync_threads()
    return prefix, need


class RadixTopk:
    """The engine for one static configuration: source dtype, pinned id or not, cluster size."""

    def __init__(self, source, pinned: bool, ranks: int):
        self.source, self.pinned, self.ranks = source, pinned, ranks

    @cute.jit
    def __call__(self, src: cute.Tensor, lengths: cute.Tensor, cols: Int32, block: Int32, k_sel: Int32,
                 out: cute.Tensor, stream):
        self.kernel(src, lengths, cols, block, k_sel, out).launch(
            grid=[self.ranks, out.shape[0], 1], block=[THREADS, 1, 1], cluster=[self.ranks, 1, 1],
            stream=stream,
        )

    @cute.jit
    def key_at(self, src: cute.Tensor, row: Int32, i: Int32) -> Uint32:
        if cutlass.const_expr(self.source is Int32):
            return src[row, i].bitcast(Uint32)  # block keys, already ordered
        elif cutlass.const_expr(self.source is BFloat16):
            return ordered_key(src[row, i].to(Float32))
        else:
            return ordered_key(src[row, i])

    @cute.jit
    def keep_best(self, buf_key: cute.Tensor, buf_id: cute.Tensor, n: Int32, t: Uint32, take_eq: Int32,
                  eq_before: Int32, counts: cute.Tensor, eq_base: cute.Tensor, warp_sums: cute.Tensor,
                  tid: Int32, dst_key: cute.Tensor, dst_id: cute.Tensor, out: cute.Tensor, row: Int32,
                  out_base: Int32, to_out: cutlass.Constexpr[bool]):
        """Keys > t and the first ``take_eq - eq_before`` keys == t of ``buf[:n]``, in order: into
        ``dst`` or, as ids, into ``out[row, out_base:]``. Returns how many."""
        lane, warp = tid % 32, tid // 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        steps = (n + THREADS - 1) // THREADS
        eq_base[tid] = Int32(0)
        counts[tid] = Int32(0)
        cute.arch.sync_threads()
        for m in range(steps):
            j = m * THREADS + tid
            tied = Boolean(False)
            if j < n:
                tied = buf_key[j] == t
            ballot = ballot_of(tied)
            if lane == 0:
                eq_base[m * WARPS + warp] = Int32(cute.arch.popc(ballot))
        scan_counts(eq_base, THREADS, warp_sums, tid)
        for m in range(steps):
            j = m * THREADS + tid
            key = Uint32(0)
            if j < n:
                key = buf_key[j]
            tied = (key == t) & (j < n)
            rank = eq_before + eq_base[m * WARPS + warp] + Int32(cute.arch.popc(ballot_of(tied) & lower))
            keep = (j < n) & ((key > t) | (tied & (rank < take_eq)))
            kept = ballot_of(keep)
            if lane == 0:
                counts[m * WARPS + warp] = Int32(cute.arch.popc(kept))
        total = scan_counts(counts, THREADS, warp_sums, tid)
        for m in range(steps):
            j = m * THREADS + tid
            key = Uint32(0)
            if j < n:
                key = buf_key[j]
            tied = (key == t) & (j < n)
            rank = eq_before + eq_base[m * WARPS + warp] + Int32(cute.arch.popc(ballot_of(tied) & lower))
            keep = (j < n) & ((key > t) | (tied & (rank < take_eq)))
            kept = ballot_of(keep)
            if keep:
                slot = counts[m * WARPS + warp] + Int32(cute.arch.popc(kept & lower))
                if cutlass.const_expr(to_out):
                    out[row, out_base + slot] = buf_id[j]
                else:
                    dst_key[slot] = key
                    dst_id[slot] = buf_id[j]
        cute.arch.sync_threads()
        return total

    @cute.kernel
    def kernel(self, src: cute.Tensor, lengths: cute.Tensor, cols: Int32, block: Int32, k_sel: Int32,
               out: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        rank, row, _ = cute.arch.block_idx()
        lane, warp = tid % 32, tid // 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)

        smem = cutlass.memory.SmemAllocator()
        buf_key = smem.allocate_tensor(Uint32, cute.make_layout(CAP), 16)
        buf_id = smem.allocate_tensor(Int32, cute.make_layout(CAP), 16)
        best_key = smem.allocate_tensor(Uint32, cute.make_layout(MAX_K), 16)  # a select's output
        best_id = smem.allocate_tensor(Int32, cute.make_layout(MAX_K), 16)
        hist = smem.allocate_tensor(Int32, cute.make_layout(3 * BINS), 16)
        counts = smem.allocate_tensor(Int32, cute.make_layout(THREADS), 16)
        eq_base = smem.allocate_tensor(Int32, cute.make_layout(THREADS), 16)
        warp_sums = smem.allocate_tensor(Int32, cute.make_layout(WARPS), 16)
        result = smem.allocate_tensor(Int32, cute.make_layout(2), 16)
        shared = smem.allocate_tensor(Int32, cute.make_layout(4), 16)  # read by the other CTAs

        # Valid keys of this row (blocks: all valid blocks but the pinned newest) and this CTA's span.
        valid = (max(min(lengths[row], cols), Int32(0)) + block - 1) // block
        n = valid
        if cutlass.const_expr(self.pinned):
            n = max(valid - 1, Int32(0))
        span = (n + self.ranks - 1) // self.ranks
        lo = min(rank * span, n)
        hi = min(lo + span, n)

        # 1. Stream the span: keys above the threshold join the buffer, in index order. A select
        # keeps the buffer's best k_sel when it is too full for a tile, and once after the last.
        cnt = Int32(0)
        thr = Uint32(0)
        tiles = (hi - lo + TILE - 1) // TILE
        for tile in range(0, tiles + 1):
            if (cnt > CAP - TILE) | ((tile == tiles) & (cnt > k_sel)):
                t, take = find_threshold(buf_key, cnt, k_sel, hist, result, warp_sums, tid, 1)
                self.keep_best(buf_key, buf_id, cnt, t, take, Int32(0), counts, eq_base, warp_sums, tid,
                               best_key, best_id, out, row, Int32(0), False)
                for i in range(tid, k_sel, THREADS):
                    buf_key[i] = best_key[i]
                    buf_id[i] = best_id[i]
                cute.arch.sync_threads()
                cnt = k_sel
                thr = t
            if tile < tiles:
                start = lo + tile * TILE
                keys = cute.make_rmem_tensor(PER, Uint32)
                for i in cutlass.range_constexpr(PER):
                    e = start + i * THREADS + tid
                    keys[i] = Uint32(0)
                    if e < hi:
                        keys[i] = self.key_at(src, row, e)
                for i in cutlass.range_constexpr(PER):
                    ballot = ballot_of(keys[i] > thr)
                    if lane == 0:
                        counts[i * WARPS + warp] = Int32(cute.arch.popc(ballot))
                added = scan_counts(counts, PER * WARPS, warp_sums, tid)
                for i in cutlass.range_constexpr(PER):
                    ballot = ballot_of(keys[i] > thr)
                    if keys[i] > thr:
                        slot = cnt + counts[i * WARPS + warp] + Int32(cute.arch.popc(ballot & lower))
                        buf_key[slot] = keys[i]
                        buf_id[slot] = start + i * THREADS + tid
                cnt = cnt + added
        cute.arch.sync_threads()

        # 2. The cluster's best k_sel over all spans: one more select, histograms summed over DSMEM.
        if tid == 0:
            shared[0] = cnt
        cluster_sync(self.ranks)
        total = Int32(0)
        for r in cutlass.range_constexpr(self.ranks):
            total = total + load_rank(shared, Int32(0), r)
        t = Uint32(0)  # when every key fits, keep every key (all are > 0)
        take = Int32(0)
        if total > k_sel:
            t, take = find_threshold(buf_key, cnt, k_sel, hist, result, warp_sums, tid, self.ranks)
        above = Int32(0)
        tied = Int32(0)
        for j in range(tid, cnt, THREADS):
            if j < cnt:
                key = buf_key[j]
                above = above + Int32(key > t)
                tied = tied + Int32(key == t)
        _, above = exclusive_scan(above, warp_sums, tid)
        _, tied = exclusive_scan(tied, warp_sums, tid)
        if tid == 0:
            shared[1] = above
            shared[2] = tied
        cluster_sync(self.ranks)
        # Ties at t go to the lowest ids: CTA r takes them after the CTAs before it in the row.
        eq_run = Int32(0)
        eq_before = Int32(0)
        out_base = Int32(0)
        out_total = Int32(0)
        for r in cutlass.range_constexpr(self.ranks):
            eq_r = load_rank(shared, Int32(2), r)
            taken = load_rank(shared, Int32(1), r) + min(max(take - eq_run, Int32(0)), eq_r)
            if r < rank:
                out_base = out_base + taken
            if r == rank:
                eq_before = eq_run
            out_total = out_total + taken
            eq_run = eq_run + eq_r
        self.keep_best(buf_key, buf_id, cnt, t, take, eq_before, counts, eq_base, warp_sums, tid,
                       best_key, best_id, out, row, out_base, True)
        if rank == self.ranks - 1:
            pad_from = out_total
            if cutlass.const_expr(self.pinned):
                if valid > 0:
                    if tid == 0:
                        out[row, out_total] = valid - 1
                    pad_from = out_total + 1
            for i in range(pad_from + tid, out.shape[1], THREADS):
                out[row, i] = Int32(-1)
        cluster_sync(self.ranks)  # no CTA leaves while others may read its shared memory


# ------------------------------------------------------------------------------- block keys


@triton.jit
def _block_keys(logits, stride, ends, width, keys, keys_stride,
                BLOCK: tl.constexpr, BLOCK_P2: tl.constexpr, BLOCKS: tl.constexpr):
    """keys[row, b]: the engine's key of block b's max over its valid columns (NaN ignored)."""
    row = tl.program_id(0)
    first = tl.program_id(1) * BLOCKS
    n_cols = tl.minimum(tl.maximum(tl.load(ends + row), 0), width)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    if first < n_blocks:
        b = first + tl.arange(0, BLOCKS)
        lane = tl.arange(0, BLOCK_P2)[None, :]
        cols = b[:, None] * BLOCK + lane
        inside = (b[:, None] < n_blocks) & (cols < n_cols) & (lane < BLOCK)
        x = tl.load(logits + row.to(tl.int64) * stride + cols, mask=inside, other=float("-inf"))
        x = tl.max(tl.where(x != x, float("-inf"), x), axis=1)
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 ties +0.0
        key = bits ^ tl.where(bits < 0, -1, -2147483648)  # unsigned order = score order
        tl.store(keys + row.to(tl.int64) * keys_stride + b, key, mask=b < n_blocks)


def block_keys(logits: torch.Tensor, row_ends: torch.Tensor, block_size: int) -> torch.Tensor:
    """int32 [rows, ceil(width / block_size)] holding unsigned keys; only valid blocks written."""
    rows, width = logits.shape
    num_blocks = -(-width // block_size)
    keys = torch.empty(rows, num_blocks, dtype=torch.int32, device=logits.device)
    block_p2 = max(triton.next_power_of_2(block_size), 1)
    per_program = max(8192 // block_p2, 1)
    if rows and num_blocks:
        _block_keys[(rows, triton.cdiv(num_blocks, per_program))](
            logits, logits.stride(0), row_ends, width, keys, keys.stride(0),
            BLOCK=block_size, BLOCK_P2=block_p2, BLOCKS=per_program, num_warps=8,
        )
    return keys


# ------------------------------------------------------------------------------- launching


def cluster_size(rows: int, keys_per_row: int) -> int:
    """CTAs per row: one per 32K keys up to 8, fewer when the rows alone fill the GPU."""
    ranks = 1
    while ranks < MAX_CLUSTER and ranks * 32768 < keys_per_row and rows * ranks < 256:
        ranks *= 2
    return ranks


@functools.lru_cache(maxsize=None)
def compiled(source: torch.dtype, pinned: bool, ranks: int):
    """Compile once per (source dtype, pinned, cluster size), from fake tensors (no GPU needed)."""
    rows, width = cute.sym_int(), cute.sym_int()
    dtype = SOURCES[source]
    fake = cute.runtime.make_fake_tensor
    src = fake(dtype, (rows, width), stride=(cute.sym_int64(), 1), assumed_align=dtype.width // 8)
    lengths = fake(Int32, (rows,), stride=(1,), assumed_align=4)
    out = fake(Int32, (rows, cute.sym_int()), stride=(cute.sym_int64(), 1), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    engine = RadixTopk(dtype, pinned, ranks)
    return cute.compile(engine, src, lengths, Int32(0), Int32(1), Int32(1), out, stream,
                        options="--enable-tvm-ffi")


def _select(src: torch.Tensor, lengths: torch.Tensor, cols: int, block: int, k_sel: int, out: torch.Tensor,
            pinned: bool) -> None:
    rows = out.shape[0]
    if rows == 0:
        return
    ranks = cluster_size(rows, src.shape[1])
    compiled(src.dtype, pinned, ranks)(src, lengths, cols, block, k_sel, out)


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """The CUDA kernel of ``sparse_decode::indexer_topk`` (arguments already checked)."""
    _select(scores, lengths, scores.shape[1], 1, k, out, pinned=False)


def select_candidate_blocks(logits: torch.Tensor, row_ends: torch.Tensor, block_size: int, out: torch.Tensor) -> None:
    """The CUDA kernel of ``sparse_decode::select_candidate_blocks`` (arguments already checked)."""
    keys = block_keys(logits, row_ends, block_size)
    _select(keys, row_ends, logits.shape[1], block_size, out.shape[1] - 1, out, pinned=True)


def warm(device: torch.device) -> None:
    """Compile every engine configuration and the decode shapes' block-key kernels."""
    for ranks in (1, 2, 4, 8):
        for source in SOURCES:
            compiled(source, source is torch.int32, ranks)
    x = torch.zeros(1, 1 << 15, device=device)
    n = torch.full((1,), 1 << 15, dtype=torch.int32, device=device)
    for block in (8, 64):
        block_keys(x, n, block)
