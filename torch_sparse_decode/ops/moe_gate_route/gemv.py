"""The router front's GEMV (``Gemv``, a mixin of ``front.GateFront``): a CTA's weight rows
staged in shared memory and their dot products with the batch's hidden states, as the warps'
partial sums.

- Staging: every row of the CTA's experts at once, in column slices of THREADS 16-byte vectors,
  so slice k can be used while later ones land: 16-byte cp.async by every thread (the default),
  or a few bulk copies on one mbarrier a slice (``bulk``).
- Sums: FMAs on the CUDA cores, each thread over its own column vectors and ``chunk`` tokens
  (the default), or MMAs on the tensor cores (``mma``): the CTA's experts as the rows of
  16 x 8 x 16 bf16 MMAs, MMA_TOKENS tokens their columns, so the instructions no longer grow
  with the batch.

The host supplies ``experts``, ``rows``, ``words``, ``vecs``, ``per``, ``chunk``, ``bulk``,
``mma``, ``profile``, ``mark`` and ``count_in`` (the front's mailbox counting in, called once the
first hidden vectors are in flight).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ...kernels.cute import copy_async16, load_global16, load_shared16
from ..moe_route.kernel import THREADS, WARPS
from ..moe_route.scoring import warp_sum

MMA_ROWS = 16  # an MMA's rows: a CTA's experts, padded
MMA_TOKENS = 8  # an MMA's columns: tokens


@cute.jit
def bf16_pair(word: Uint32):
    """The two bf16 of a 32-bit word (element 2j low, 2j + 1 high) as fp32."""
    return (word << Uint32(16)).bitcast(Float32), (word & Uint32(0xFFFF0000)).bitcast(Float32)


@cute.jit
def copy_bulk(dst: Int32, src: Int64, nbytes: Int32, landed: Int32):
    """A bulk copy of ``nbytes`` (a multiple of 16) from global ``src`` to shared ``dst`` (both
    16-byte aligned), counted on the mbarrier at shared ``landed`` as it lands."""
    cute.arch.inline_ptx("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                         "[{$r0}], [{$r1}], {$r2}, [{$r3}];", read_only_args=[dst, src, nbytes, landed])


@cute.jit
def mma_bf16(a: tuple, b: tuple, c: tuple):
    """d = a b + c for one warp: a 16 x 16 bf16 tile (four words a lane), b 16 x 8 (two words),
    c and d 16 x 8 fp32 (four a lane); the layouts of PTX's m16n8k16 ``row.col``."""
    return cute.arch.inline_ptx(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 { {$w0}, {$w1}, {$w2}, {$w3} }, "
        "{ {$r0}, {$r1}, {$r2}, {$r3} }, { {$r4}, {$r5} }, { {$r6}, {$r7}, {$r8}, {$r9} };",
        write_only_types=[Float32] * 4, read_only_args=[*a, *b, *c])


class Gemv:
    """Staging and sums (see the module docstring)."""

    @cute.jit
    def stage_weights(self, gate: cute.Tensor, staged: cute.Tensor, cta: Int32, tid: Int32):
        """Every weight row of this CTA's experts to shared memory at once (cp.async, one commit
        group per column slice k, so slice k can be used while later ones land). Each thread
        copies only the 16-byte vectors it reads itself, so waiting needs no CTA barrier."""
        for k in cutlass.range_constexpr(self.per):
            v = tid + THREADS * k
            if v < self.vecs:
                for r in cutlass.range_constexpr(self.rows):
                    expert = min(cta * self.rows + r, self.experts - 1)  # a CTA's rows past E: discarded
                    at = r * self.words + 4 * v
                    copy_async16(Int32((staged.iterator + at).toint()),
                                 Int64((gate.iterator + (Int64(expert) * self.words + 4 * v)).toint()), Int32(16))
            cute.arch.cp_async_commit_group()

    @cute.jit
    def stage_bulk(self, gate: cute.Tensor, staged: cute.Tensor, landed: cute.Tensor, cta: Int32, tid: Int32):
        """``stage_weights`` by bulk copies: slice k (the vectors THREADS * k onward of every row,
        the ones thread tid reads at step k) lands on mbarrier k, copied a row at a time by one
        lane of warp 0 each. Threads wait on it only after ``count_in``'s CTA barrier, which
        follows the barriers' initialization."""
        if tid == 0:
            for k in cutlass.range_constexpr(self.per):
                cute.arch.mbarrier_init(landed.iterator + k, 1)
            cute.arch.mbarrier_init_fence()
            for k in cutlass.range_constexpr(self.per):
                vecs = min(THREADS, self.vecs - THREADS * k)
                cute.arch.mbarrier_arrive_and_expect_tx(landed.iterator + k, self.rows * vecs * 16)
        if tid < 32:
            cute.arch.sync_warp()
            for first in cutlass.range_constexpr(0, self.rows * self.per, 32):
                c = tid + first
                if c < self.rows * self.per:
                    k, r = c // self.rows, c % self.rows
                    expert = min(cta * self.rows + r, self.experts - 1)  # a CTA's rows past E: discarded
                    at = r * self.words + 4 * THREADS * k
                    vecs = min(Int32(THREADS), self.vecs - THREADS * k)
                    copy_bulk(Int32((staged.iterator + at).toint()),
                              Int64((gate.iterator + (Int64(expert) * self.words + 4 * THREADS * k)).toint()),
                              vecs * 16, Int32((landed.iterator + k).toint()))

    @cute.jit
    def gemv_fma(self, hidden: cute.Tensor, staged: cute.Tensor, partial: cute.Tensor, landed: cute.Tensor,
                 state: cute.Tensor, first: Int32, cta: Int32, tid: Int32, warp: Int32, lane: Int32):
        """Tokens first .. first + chunk - 1 on the CUDA cores. Thread tid owns the 16-byte column
        vectors tid + THREADS * k (8 bf16 each) of every row and of the chunk's hidden states; its
        FMAs are summed over each warp (butterfly) into ``partial``."""
        tokens = hidden.shape[0]
        rows, chunk, per = self.rows, self.chunk, self.per
        xs = cute.make_rmem_tensor(chunk * per * 4, Uint32)  # (token, k, word)
        for k in cutlass.range_constexpr(per):
            v = tid + THREADS * k
            for t in cutlass.range_constexpr(chunk):
                for w in cutlass.range_constexpr(4):
                    xs[(t * per + k) * 4 + w] = Uint32(0)
                if (v < self.vecs) & (first + t < tokens):
                    x = load_global16(Int64((hidden.iterator + (Int64(first + t) * self.words + 4 * v)).toint()))
                    for w in cutlass.range_constexpr(4):
                        xs[(t * per + k) * 4 + w] = x[w]
        if first == 0:
            self.count_in(state, tid)
        acc = cute.make_rmem_tensor(rows * chunk, Float32)
        for q in cutlass.range_constexpr(rows * chunk):
            acc[q] = Float32(0.0)
        for k in cutlass.range_constexpr(per):
            v = tid + THREADS * k
            self.wait_slice(landed, k, state, first, cta, tid)
            if v < self.vecs:
                xf = cute.make_rmem_tensor(chunk * 8, Float32)
                for t in cutlass.range_constexpr(chunk):
                    for w in cutlass.range_constexpr(4):
                        xf[t * 8 + 2 * w], xf[t * 8 + 2 * w + 1] = bf16_pair(xs[(t * per + k) * 4 + w])
                for r in cutlass.range_constexpr(rows):
                    g = load_shared16(Int32((staged.iterator + (r * self.words + 4 * v)).toint()))
                    for w in cutlass.range_constexpr(4):
                        g0, g1 = bf16_pair(g[w])
                        for t in cutlass.range_constexpr(chunk):
                            # bf16 products are exact in fp32: FMA or not, one rounding per add
                            acc[r * chunk + t] = g0 * xf[t * 8 + 2 * w] + acc[r * chunk + t]
                            acc[r * chunk + t] = g1 * xf[t * 8 + 2 * w + 1] + acc[r * chunk + t]
        self.mark(state, "GEMV", cta, tid)
        cute.arch.sync_threads()  # the previous chunk's partials are read
        for q in cutlass.range_constexpr(rows * chunk):
            total = warp_sum(acc[q])
            if lane == 0:
                partial[warp * rows * chunk + q] = total

    @cute.jit
    def wait_slice(self, landed: cute.Tensor, k: cutlass.Constexpr[int], state: cute.Tensor, first: Int32, cta: Int32,
                   tid: Int32):
        """Until column slice k of the CTA's weight rows has landed (at once after the first chunk)."""
        if cutlass.const_expr(self.bulk):
            cute.arch.mbarrier_wait(landed.iterator + k, 0)
        else:
            cute.arch.cp_async_wait_group(self.per - 1 - k)
        if cutlass.const_expr(self.profile and k == self.per - 1):
            if first == 0:
                self.mark(state, "weights in", cta, tid)

    @cute.jit
    def gemv_mma(self, hidden: cute.Tensor, staged: cute.Tensor, partial: cute.Tensor, landed: cute.Tensor,
                 state: cute.Tensor, first: Int32, cta: Int32, tid: Int32, warp: Int32, lane: Int32):
        """Tokens first .. first + chunk - 1 on the tensor cores. In each column slice, warp w
        takes 32-column blocks; in a block, lane (g, q) = (lane / 4, lane % 4) reads 16 bytes
        (columns 8 q .. 8 q + 7) of row g (and g + 8) and of token g's hidden vector, and feeds
        them to two MMAs as k = 2 q, 2 q + 1, 2 q + 8, 2 q + 9 of each: a permutation of the
        block's columns, the same for the weights and the hidden states, so the dot products are
        the block's. Token g's vectors of slice k + 1 are read while slice k is summed. Each
        warp's fp32 sums go to ``partial``."""
        g, q = lane // 4, lane % 4
        rows, per, tiles = self.rows, self.per, self.chunk // MMA_TOKENS
        blocks = THREADS // 4 // WARPS  # a warp's 32-column blocks of a slice
        row_a = min(g, rows - 1)  # rows past the CTA's: any row, their sums discarded
        row_b = min(g + 8, rows - 1)
        xs = cute.make_rmem_tensor(2 * blocks * tiles * 4, Uint32)  # two slices' hidden words, in turn
        self.load_hidden(hidden, xs, 0, first, warp, g, q)
        if first == 0:
            self.count_in(state, tid)
        acc = cute.make_rmem_tensor(tiles * 4, Float32)
        for i in cutlass.range_constexpr(tiles * 4):
            acc[i] = Float32(0.0)
        for k in cutlass.range_constexpr(per):
            if cutlass.const_expr(k + 1 < per):
                self.load_hidden(hidden, xs, k + 1, first, warp, g, q)
            self.wait_slice(landed, k, state, first, cta, tid)
            for j in cutlass.range_constexpr(blocks):
                v = THREADS * k + (warp * blocks + j) * 4 + q
                if v < self.vecs:  # the same in the whole warp (vecs is a multiple of 4)
                    wa = load_shared16(Int32((staged.iterator + (row_a * self.words + 4 * v)).toint()))
                    wb = (Uint32(0), Uint32(0), Uint32(0), Uint32(0))
                    if cutlass.const_expr(rows > 8):
                        wb = load_shared16(Int32((staged.iterator + (row_b * self.words + 4 * v)).toint()))
                    for tile in cutlass.range_constexpr(tiles):
                        at = (((k % 2) * blocks + j) * tiles + tile) * 4
                        c = (acc[tile * 4], acc[tile * 4 + 1], acc[tile * 4 + 2], acc[tile * 4 + 3])
                        c = mma_bf16((wa[0], wb[0], wa[1], wb[1]), (xs[at], xs[at + 1]), c)
                        c = mma_bf16((wa[2], wb[2], wa[3], wb[3]), (xs[at + 2], xs[at + 3]), c)
                        for i in cutlass.range_constexpr(4):
                            acc[tile * 4 + i] = c[i]
        self.mark(state, "GEMV", cta, tid)
        cute.arch.sync_threads()  # the previous chunk's partials are read
        base = warp * MMA_ROWS * self.chunk
        for tile in cutlass.range_constexpr(tiles):
            for h in cutlass.range_constexpr(2):  # rows g, g + 8
                for e in cutlass.range_constexpr(2):  # tokens 2 q, 2 q + 1 of the tile
                    partial[base + (g + 8 * h) * self.chunk + tile * MMA_TOKENS + 2 * q + e] = acc[tile * 4 + 2 * h + e]

    @cute.jit
    def load_hidden(self, hidden: cute.Tensor, xs: cute.Tensor, k: cutlass.Constexpr[int], first: Int32, warp: Int32,
                    g: Int32, q: Int32):
        """Token first + 8 tile + g's 16-byte vectors that ``gemv_mma`` reads in slice k, into half k % 2
        of ``xs`` (zeros past the batch or the row)."""
        tokens = hidden.shape[0]
        blocks, tiles = THREADS // 4 // WARPS, self.chunk // MMA_TOKENS
        for j in cutlass.range_constexpr(blocks):
            v = THREADS * k + (warp * blocks + j) * 4 + q
            for tile in cutlass.range_constexpr(tiles):
                at = (((k % 2) * blocks + j) * tiles + tile) * 4
                token = first + tile * MMA_TOKENS + g
                for w in cutlass.range_constexpr(4):
                    xs[at + w] = Uint32(0)
                if (v < self.vecs) & (token < tokens):
                    x = load_global16(Int64((hidden.iterator + (Int64(token) * self.words + 4 * v)).toint()))
                    for w in cutlass.range_constexpr(4):
                        xs[at + w] = x[w]

    @cute.jit
    def stage(self, gate: cute.Tensor, staged: cute.Tensor, landed: cute.Tensor, cta: Int32, tid: Int32):
        if cutlass.const_expr(self.bulk):
            self.stage_bulk(gate, staged, landed, cta, tid)
        else:
            self.stage_weights(gate, staged, cta, tid)
