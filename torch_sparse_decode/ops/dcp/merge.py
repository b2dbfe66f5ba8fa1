"""The DCP one-round merge on the GPU (CuTe DSL): the CUDA kernel of ``launch.launch_merge``.

One CTA of 1024 threads per row, everything between the rows and the outputs in shared memory:

- Wait (a step): the rows arrive as tagged units (``exchange.py``). Thread 0 polls the last unit
  of every rank's row while the others clear shared memory.
- The W sent B' rows (W * N <= 6240 candidates) go into registers as (ord16, global id); in a
  step every thread checks its units' tags and polls any that came late.
- t16, the ord16 of the K-th candidate, in two 8-bit digits: a 256-bin shared histogram each,
  scanned from the top by one warp (8 bins a lane). Per rank, the lowest sent ord16 (an empty
  slot counts as -1) gives the saturation test "a full row whose lowest ord16 >= t16" (a superset
  of the exact test; rescuing a rank that did not need it adds only candidates of its local
  top-K, so the answer stays exact). With any saturated rank the candidates (its rescue row,
  read through the address table, in place of its sent row; in a step polled for its tags first)
  are streamed from memory through the same two digits and the output instead.
- Output, ascending whatever the slot order: candidates at or above t16 set bits of two shared
  bitmaps over global ids (S: above t16, T: at t16), 2**17 ids a chunk; one scan of the words'
  popcounts gives each selected id its slot, S below + min(T below, ties), and a tie is taken
  iff its T rank < ties. The ids land in shared memory, then go out coalesced; this rank's local
  ids follow from a warp-ordered compaction of them.
- A step's merge is launched as a programmatic dependent of the pack, which lets it start at the
  pack's start: its launch and setup overlap the pack, and the tags (not the stream) order it
  after every rank's rows. (Nothing else it reads is written by the pack: the step counter is
  advanced by the previous step's merge, and the kernels before the pack finished before it.)
- A step's tag holds its sequence number and row count, so a peer's step of other rows is told
  apart at once. Every wait of a step ends ``timeout_ns`` after the step's first wait began
  (``state[3]``). A row whose rows did not arrive gets no ids (-1, count 0) and sets its ranks'
  bits in the error word (late, or another row count); the step's last CTA advances the step
  counter (the buffers' parity and the tag).

Why CuTe DSL: the merge is a chain of CTA-wide steps on a few thousand keys (latency, not
bandwidth); shared-memory atomics, warp votes and one-warp scans make each step a barrier or two,
where the Triton merge (``ops/dcp/merge_triton.py``, which the CPU interpreter runs in CI) needs block-wide
reductions. Both take the same arguments and give bit-identical results.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from ...kernels.compile import cached_kernel, fake_stream, fake_tensor
from ...kernels.cute import (begin_marks, block_exclusive, popc, scan_from_top, stamp, warp_max,
                             warp_min, zero_fill)
from ...limits import TOPK_MAX_K as MAX_K  # the selected ids stay in shared memory
from .config import BUILT_TOPK, BUILT_WORLD_SIZES, NO_WAIT, dcp_merge_local_topk, rescue_row_slots
from .exchange import ABOVE, DIGIT, LATE, NEED, TOP, RowReads, Rows, load_unit, step_tag, tag_of, wait_began

# Threads per CTA (one row). The phases are short chains bound by latency and instruction issue;
# more warps hide more of it (H200, W = 2, T = 8: 256 threads 8.3 us, 512 6.1, 1024 5.65).
THREADS = 1024
WARPS = THREADS // 32
DIGIT_BINS = 256  # ord16 in two 8-bit digits
CHUNK_WORDS = 4096  # output bitmap words per chunk: 2**17 global ids
CHUNK_IDS = 32 * CHUNK_WORDS
OWN_WORDS = CHUNK_WORDS // THREADS  # bitmap words each thread scans (contiguous)
T_SHIFT = 15  # packed bitmap counts: S (< K <= 4096) below bit 15, T (< 2**17) above
# Where a profiled build (``compiled(..., profile=True)``) stamps thread 0's clock: the end of
# each phase, as cycles since the kernel began, into ``global_ids[row, self.K + phase]``.
PHASES = ("wait + clear", "load", "high digit", "low digit", "saturation", "set bits", "scan", "emit", "global ids",
          "local ids")



@cute.jit
def candidate(word: Int32, plane: Int32, j: Int32, rank, world_size: cutlass.Constexpr[int]):
    """(ord16, or -1 for an empty slot; global id) of B' slot j (``plane``: its plane word)."""
    local = (Int32(0xFFFF) - (word & Int32(0xFFFF))) | (((plane >> (j % 32)) & Int32(1)) << 16)
    key = cutlass.select_(word != Int32(0), (word >> 16) & Int32(0xFFFF), Int32(-1))
    return key, local * world_size + rank


@cute.jit
def count_in(hist: cute.Tensor, b: Int32):
    """hist[b] += 1 (shared). An atomic: ``red.shared`` was 2.8x slower on the H200 under the
    digits' contention (a few bins take most keys)."""
    cute.arch.atomic_add(hist.iterator + b, Int32(1))


@dataclass(frozen=True)
class Pass:
    """One pass over the candidates: the shared memory it counts into (digit histograms; the
    strict / tied bitmaps, their prefix counts and the picked ids of the output) and its
    threshold state: t16 (the high digit alone in the low-digit pass), the ties taken at t16, and
    in the output the chunk's first global id and the strict / tied ids of the chunks before."""

    hist: cute.Tensor
    info: cute.Tensor
    strict: cute.Tensor
    tied: cute.Tensor
    prefix: cute.Tensor
    picked: cute.Tensor
    t16: Int32
    ties: Int32
    first_id: Int32
    s_below: Int32
    t_below: Int32


class DcpMerge(RowReads):
    """The merge for one static configuration: world size W, topk K (so sent slots N and rescue
    slots R), and whether it is a step's (flags, parity, step counter) or a simulated merge's."""

    threads = THREADS

    def __init__(self, world_size: int, topk: int, exchange: bool, profile: bool = False):
        self.W, self.K, self.exchange, self.profile = world_size, topk, exchange, profile
        self.N, self.R = dcp_merge_local_topk(topk, world_size), rescue_row_slots(topk)
        self.rounds = -(-topk // THREADS)  # 32-slot rounds of each warp in the output
        self.per = -(-world_size * self.N // THREADS)  # sent candidates per thread (registers)

    @cute.jit
    def __call__(self, gathered: cute.Tensor, rank_stride: Int32, row_stride: Int32, peers: cute.Tensor,
                 rescue_offset: Int32, rescue_row_stride: Int32, global_ids: cute.Tensor, local_ids: cute.Tensor,
                 local_count: cute.Tensor, rank: Int32, state: cute.Tensor, parity_gathered: Int32,
                 parity_rescue: Int32, timeout_ns: Int64, stream):
        self.kernel(gathered, rank_stride, row_stride, peers, rescue_offset, rescue_row_stride, global_ids, local_ids,
                    local_count, rank, state, parity_gathered, parity_rescue, timeout_ns).launch(
            grid=[global_ids.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=self.exchange)

    @cute.jit
    def mark(self, marks: cute.Tensor, phase: cutlass.Constexpr[str]):
        """With ``profile``: the SM clock at the end of the phase named ("start": the kernel's start)."""
        stamp(marks, PHASES, phase, self.profile)

    # ------------------------------------------------------------------ per-candidate actions
    #
    # The same actions run on the sent candidates in registers and on a streamed candidate set.

    @cute.jit
    def act(self, action: cutlass.Constexpr[str], key: Int32, gid: Int32, ctx: Pass, top: Int32) -> Int32:
        """One candidate's part of a pass; returns the running highest live global id."""
        hist, strict, tied, prefix, picked = ctx.hist, ctx.strict, ctx.tied, ctx.prefix, ctx.picked
        t16, ties, first_id, s_below, t_below = ctx.t16, ctx.ties, ctx.first_id, ctx.s_below, ctx.t_below
        if cutlass.const_expr(action == "high digit"):
            if key >= 0:
                count_in(hist, key >> 8)
                top = max(top, gid)
        elif cutlass.const_expr(action == "low digit"):
            if (key >> 8) == (t16 >> 8):  # t16 holds the high digit here
                count_in(hist, DIGIT_BINS + (key & Int32(0xFF)))
        else:
            at = gid - first_id
            inside = (key >= t16) & (key >= 0) & (at >= 0) & (at < CHUNK_IDS)
            w = cutlass.select_(inside, at >> 5, Int32(0))  # loads outside a branch overlap
            bit = Uint32(1) << Uint32(at & 31)
            if cutlass.const_expr(action == "set bits"):
                if inside:
                    if key > t16:
                        cute.arch.atomic_or(strict.iterator + w, bit)
                    else:
                        cute.arch.atomic_or(tied.iterator + w, bit)
            else:  # "emit": the id at its slot among the selected
                below = bit - Uint32(1)
                counts = prefix[w]
                s_rank = s_below + Int32(counts & Uint32((1 << T_SHIFT) - 1)) + popc(strict[w] & below)
                t_rank = t_below + Int32(counts >> Uint32(T_SHIFT)) + popc(tied[w] & below)
                if inside & ((key > t16) | (t_rank < ties)):
                    picked[s_rank + min(t_rank, ties)] = gid
        return top

    @cute.jit
    def each_sent(self, action: cutlass.Constexpr[str], keys: cute.Tensor, gids: cute.Tensor, ctx: Pass, top: Int32):
        for i in cutlass.range_constexpr(self.per):
            top = self.act(action, keys[i], gids[i], ctx, top)
        return top

    @cute.jit
    def each_streamed(self, action: cutlass.Constexpr[str], src: Rows, saturated: Int32, ctx: Pass, tid: Int32,
                      top: Int32):
        """The action over every candidate of the rescued set: a saturated rank's rescue row (from
        its buffer) in place of its sent row."""
        for r in range(self.W):
            rescued = ((saturated >> r) & 1) != 0
            slots = cutlass.select_(rescued, Int32(self.R), Int32(self.N))
            sent = self.row_base(src.gathered, src.sent_at + r * src.rank_stride)
            base = cutlass.select_(rescued, src.peers[r] + Int64(src.rescue_at) * 4, sent)
            for j in range(tid, slots, THREADS):
                key, gid = candidate(self.arrived_word(base, j), self.arrived_word(base, slots + j // 32), j, r,
                                     self.W)
                top = self.act(action, key, gid, ctx, top)
        return top

    # ------------------------------------------------------------------------------ steps

    @cute.jit
    def threshold(self, streamed: cutlass.Constexpr[bool], keys, gids, src: Rows, saturated: Int32, ctx: Pass,
                  tid: Int32, marks: cute.Tensor):
        """(t16, ties, count): the K-th candidate's ord16, how many candidates at it are taken, how
        many in all (the histograms are zero on entry). Also leaves the highest live id in info."""
        hist, info = ctx.hist, ctx.info
        lane, warp = tid % 32, tid // 32
        top = Int32(-1)
        if cutlass.const_expr(streamed):
            top = self.each_streamed("high digit", src, saturated, ctx, tid, top)
        else:
            top = self.each_sent("high digit", keys, gids, ctx, top)
        top = warp_max(top)
        if lane == 0:
            cute.arch.atomic_max(info.iterator + TOP, top)
        cute.arch.sync_threads()
        if warp == 0:
            scan_from_top(lambda b: hist[b], Int32(-1), Int32(self.K), info, lane)
        cute.arch.sync_threads()
        high, above, need = info[DIGIT], info[ABOVE], info[NEED]
        self.mark(marks, "high digit")
        low_ctx = replace(ctx, t16=high << 8)
        if cutlass.const_expr(streamed):
            self.each_streamed("low digit", src, saturated, low_ctx, tid, top)
        else:
            self.each_sent("low digit", keys, gids, low_ctx, top)
        cute.arch.sync_threads()
        if warp == 0:
            scan_from_top(lambda b: hist[DIGIT_BINS + b], need - above, Int32(self.K), info, lane)
        cute.arch.sync_threads()
        self.mark(marks, "low digit")
        return (high << 8) | info[DIGIT], need - above - info[ABOVE], need

    @cute.jit
    def emit(self, keys, gids, src: Rows, saturated: Int32, ctx: Pass, tid: Int32, warp_sums: cute.Tensor,
             marks: cute.Tensor):
        """The selected ids, ascending, into ``picked`` (the bitmaps are zero on entry); streamed
        over the rescued set when a rank is ``saturated``."""
        info, strict, tied, prefix = ctx.info, ctx.strict, ctx.tied, ctx.prefix
        streamed = saturated != 0
        chunks = info[TOP] // CHUNK_IDS + 1
        counts = cute.make_rmem_tensor(OWN_WORDS, Int32)
        s_below = Int32(0)
        t_below = Int32(0)
        for c in range(chunks):
            chunk_ctx = replace(ctx, first_id=c * CHUNK_IDS, s_below=s_below, t_below=t_below)
            if streamed:
                self.each_streamed("set bits", src, saturated, chunk_ctx, tid, Int32(0))
            else:
                self.each_sent("set bits", keys, gids, chunk_ctx, Int32(0))
            cute.arch.sync_threads()
            self.mark(marks, "set bits")
            mine = Int32(0)
            for q in cutlass.range_constexpr(OWN_WORDS):
                w = tid * OWN_WORDS + q
                counts[q] = popc(strict[w]) | (popc(tied[w]) << T_SHIFT)
                mine = mine + counts[q]
            run, total = block_exclusive(mine, warp_sums, tid, WARPS)
            for q in cutlass.range_constexpr(OWN_WORDS):
                prefix[tid * OWN_WORDS + q] = Uint32(run)
                run = run + counts[q]
            cute.arch.sync_threads()
            self.mark(marks, "scan")
            if streamed:
                self.each_streamed("emit", src, saturated, chunk_ctx, tid, Int32(0))
            else:
                self.each_sent("emit", keys, gids, chunk_ctx, Int32(0))
            s_below = s_below + (total & Int32((1 << T_SHIFT) - 1))
            t_below = t_below + Int32(Uint32(total) >> Uint32(T_SHIFT))
            if c + 1 < chunks:  # zero this thread's words for the next chunk, once all have read them
                cute.arch.sync_threads()
                for q in cutlass.range_constexpr(OWN_WORDS):
                    strict[tid * OWN_WORDS + q] = Uint32(0)
                    tied[tid * OWN_WORDS + q] = Uint32(0)
                cute.arch.sync_threads()
        cute.arch.sync_threads()
        self.mark(marks, "emit")

    @cute.jit
    def write_out(self, picked: cute.Tensor, count: Int32, rank: Int32, row: Int32, global_ids: cute.Tensor,
                  local_ids: cute.Tensor, local_count: cute.Tensor, warp_sums: cute.Tensor, tid: Int32,
                  marks: cute.Tensor):
        """Global ids, then this rank's local ids in order (a warp-ordered compaction: warp w owns
        ``rounds`` 32-slot rounds from 32 * rounds * w), -1 padded; every store coalesced."""
        lane, warp = tid % 32, tid // 32
        lower = (Uint32(1) << Uint32(lane)) - Uint32(1)
        ids = cute.make_rmem_tensor(self.rounds, Int32)
        votes = cute.make_rmem_tensor(self.rounds, Uint32)
        mine = Int32(0)
        for q in cutlass.range_constexpr(self.rounds):
            j = (warp * self.rounds + q) * 32 + lane
            ids[q] = cutlass.select_(j < count, picked[j], Int32(-1))
            if j < self.K:
                global_ids[row, j] = ids[q]
            votes[q] = Uint32(cute.arch.vote_ballot_sync((ids[q] >= 0) & (ids[q] % self.W == rank)))
            mine = mine + popc(votes[q])
        at, n_mine = block_exclusive(cutlass.select_(lane == 0, mine, Int32(0)), warp_sums, tid, WARPS)
        at = cute.arch.shuffle_sync(at, 0)
        self.mark(marks, "global ids")
        for q in cutlass.range_constexpr(self.rounds):
            j = (warp * self.rounds + q) * 32 + lane
            if (votes[q] >> Uint32(lane)) & Uint32(1) != Uint32(0):
                local_ids[row, at + popc(votes[q] & lower)] = ids[q] // self.W
            at = at + popc(votes[q])
            if (j >= n_mine) & (j < self.K):
                local_ids[row, j] = Int32(-1)
        if tid == 0:
            local_count[row] = n_mine

    @cute.kernel
    def kernel(self, gathered: cute.Tensor, rank_stride: Int32, row_stride: Int32, peers: cute.Tensor,
               rescue_offset: Int32, rescue_row_stride: Int32, global_ids: cute.Tensor, local_ids: cute.Tensor,
               local_count: cute.Tensor, rank: Int32, state: cute.Tensor, parity_gathered: Int32,
               parity_rescue: Int32, timeout_ns: Int64):
        tid, _, _ = cute.arch.thread_idx()
        lane = tid % 32
        row, _, _ = cute.arch.block_idx()

        smem = cutlass.memory.SmemAllocator()
        hist = smem.allocate_tensor(Int32, cute.make_layout(2 * DIGIT_BINS), 16)
        lowest = smem.allocate_tensor(Int32, cute.make_layout(16), 16)  # per rank: its lowest sent ord16
        info = smem.allocate_tensor(Int32, cute.make_layout(8), 16)
        warp_sums = smem.allocate_tensor(Int32, cute.make_layout(WARPS), 16)
        strict = smem.allocate_tensor(Uint32, cute.make_layout(CHUNK_WORDS), 16)  # S: ids above t16
        tied = smem.allocate_tensor(Uint32, cute.make_layout(CHUNK_WORDS), 16)  # T: ids at t16
        prefix = smem.allocate_tensor(Uint32, cute.make_layout(CHUNK_WORDS), 16)  # packed counts below a word
        picked = smem.allocate_tensor(Int32, cute.make_layout(MAX_K), 16)  # the selected ids, ascending
        marks = cute.make_rmem_tensor(len(PHASES) + 1, Int64)
        begin_marks(marks, PHASES, self.profile)

        # Shared memory is not zero at launch; cleared while thread 0 waits for the rows.
        zero_fill(hist, 2 * DIGIT_BINS, tid, THREADS)
        for q in cutlass.range_constexpr(OWN_WORDS):
            strict[tid * OWN_WORDS + q] = Uint32(0)
            tied[tid * OWN_WORDS + q] = Uint32(0)
        if tid < 16:
            lowest[tid] = Int32(0x7FFFFFFF)
        if tid == 0:
            info[TOP] = Int32(-1)
            info[LATE] = Int32(0)

        sent_at = row * row_stride
        rescue_at = row * rescue_row_stride
        want = Int32(0)
        if cutlass.const_expr(self.exchange):
            seq = state[0]
            parity = Int32(seq & Int64(1))
            sent_at = sent_at + parity * parity_gathered
            rescue_at = rescue_offset + parity * parity_rescue + rescue_at
            rows, _, _ = cute.arch.grid_dim()
            want = step_tag(seq, Int32(rows))
        src = Rows(gathered, sent_at, rank_stride, peers, rescue_at, want, timeout_ns, info, state)
        if cutlass.const_expr(self.exchange):
            if tid == 0:  # polls every rank's row's last unit (stored last) first: the CTA's only writer
                last = Int32(self.N + self.N // 32 - 1)  # of info until the barrier (it also set it up)
                units = cute.make_rmem_tensor(self.W, Int64)
                for r in cutlass.range_constexpr(self.W):  # every load in flight before the first check
                    units[r] = load_unit(self.row_base(gathered, sent_at + r * rank_stride), last)
                for r in cutlass.range_constexpr(self.W):
                    if tag_of(units[r]) != want:
                        self.word(self.row_base(gathered, sent_at + r * rank_stride), last, src, r)
        cute.arch.sync_threads()
        self.mark(marks, "wait + clear")

        # The sent candidates into registers: thread tid holds slots tid, tid + THREADS, ... of the
        # W rows laid end to end (a warp's 32 slots are in one rank's row: N % 32 == 0).
        keys = cute.make_rmem_tensor(self.per, Int32)  # the words, then the keys
        gids = cute.make_rmem_tensor(self.per, Int32)  # the plane words, then the global ids
        if info[LATE] == 0:
            late = self.load_sent(gathered, sent_at, rank_stride, want, keys, gids, tid)
            if late != 0:  # a unit of the step was not there yet: poll until it is, or the time is up
                start = wait_began(state)
                while (late != 0) & (cute.arch.globaltimer() - start < timeout_ns):
                    late = self.load_sent(gathered, sent_at, rank_stride, want, keys, gids, tid)
                if late != 0:
                    cute.arch.atomic_or(info.iterator + LATE, late)
        if cutlass.const_expr(self.exchange):
            cute.arch.sync_threads()  # every thread has seen its units (or the time ran out)

        if info[LATE] == 0:
            for i in cutlass.range_constexpr(self.per):
                f = i * THREADS + tid
                inside = f < self.W * self.N
                f = min(f, Int32(self.W * self.N - 1))
                r = f // self.N
                key, gid = candidate(keys[i], gids[i], f - r * self.N, r, self.W)
                keys[i] = cutlass.select_(inside, key, Int32(-1))
                gids[i] = gid
                low = warp_min(keys[i])
                if (lane == 0) & inside:
                    cute.arch.atomic_min(lowest.iterator + r, low)
            self.mark(marks, "load")

            ctx = Pass(hist, info, strict, tied, prefix, picked, Int32(0), Int32(0), Int32(0), Int32(0), Int32(0))
            saturated = Int32(0)
            t16, ties, count = self.threshold(False, keys, gids, src, saturated, ctx, tid, marks)
            for r in cutlass.range_constexpr(self.W):
                if (lowest[r] >= t16) & (count > 0):
                    saturated = saturated | (1 << r)
            self.mark(marks, "saturation")
            if saturated != 0:  # the rescued candidate set, streamed
                cute.arch.sync_threads()  # every warp is done scanning the histograms
                zero_fill(hist, 2 * DIGIT_BINS, tid, THREADS)
                if tid == 0:
                    info[TOP] = Int32(-1)
                cute.arch.sync_threads()
                if cutlass.const_expr(self.exchange):
                    self.wait_rescued(src, saturated, tid)
                    cute.arch.sync_threads()
                t16, ties, count = self.threshold(True, keys, gids, src, saturated, ctx, tid, marks)
            self.emit(keys, gids, src, saturated, replace(ctx, t16=t16, ties=ties), tid, warp_sums, marks)
            self.write_out(picked, count, rank, row, global_ids, local_ids, local_count, warp_sums, tid, marks)
            self.mark(marks, "local ids")
        if cutlass.const_expr(self.exchange):
            cute.arch.sync_threads()  # a rescue row's wait may have run out in any thread
        if info[LATE] != 0:  # a peer's rows never came: no ids, and the error word
            for j in range(tid, self.K, THREADS):
                global_ids[row, j] = Int32(-1)
                local_ids[row, j] = Int32(-1)
            if tid == 0:
                local_count[row] = Int32(0)
                cute.arch.atomic_or(state.iterator + 2, Int64(info[LATE]))

        if cutlass.const_expr(self.exchange):  # the step's last CTA advances it
            cute.arch.sync_threads()
            if tid == 0:
                rows, _, _ = cute.arch.grid_dim()
                done = cute.arch.atomic_add(state.iterator + 1, Int64(1), sem="acq_rel", scope="gpu")
                if done == Int64(rows - 1):
                    state[1] = Int64(0)
                    state[3] = Int64(NO_WAIT)
                    state[0] = state[0] + Int64(1)
        if cutlass.const_expr(self.profile):  # after the ids: global_ids[row, self.K + phase]
            if tid == 0:
                for phase in cutlass.range_constexpr(len(PHASES)):
                    global_ids[row, self.K + phase] = Int32(marks[phase + 1] - marks[0])


def catalog(target) -> list[tuple]:
    """The DSA decode's K = 2048 over a node's DCP groups (W = 2, 4, 8), simulated and in a step."""
    return [(world_size, BUILT_TOPK, exchange) for world_size in BUILT_WORLD_SIZES for exchange in (False, True)]


@cached_kernel("dcp_merge", catalog)
def compiled(world_size: int, topk: int, exchange: bool, profile: bool = False):
    """The merge at one (W, K, step or simulated, profile marks), from fake tensors (no GPU needed)."""
    rows = cute.sym_int()
    flat = fake_tensor(Int32, (cute.sym_int(),), (1,))
    peers = fake_tensor(Int64, (cute.sym_int(),), (1,))
    global_ids = fake_tensor(Int32, (rows, cute.sym_int()), (cute.sym_int64(), 1))
    local_ids = fake_tensor(Int32, (rows, cute.sym_int()), (cute.sym_int64(), 1))
    count = fake_tensor(Int32, (rows,), (1,))
    state = fake_tensor(Int64, (cute.sym_int(),), (1,))
    merge = DcpMerge(world_size, topk, exchange, profile)
    return cute.compile(merge, flat, Int32(0), Int32(0), peers, Int32(0), Int32(0), global_ids, local_ids,
                        count, Int32(0), state, Int32(0), Int32(0), Int64(0), fake_stream(),
                        options="--enable-tvm-ffi")
