"""The one-launch router front (CuTe DSL): the router GEMV and the routing of a decode batch.

Every CTA of the launch (one per SM at most, so all are co-resident) first produces: it owns
``rows`` consecutive experts and copies their weight rows to shared memory at once, so the whole
read of the weights is in flight from the start, and sums their bf16 products with the batch's
hidden states in fp32 (``gemv.py``: FMAs on the CUDA cores, or opt-in MMAs on the tensor cores),
then adds the warps' sums in order. For each (token, expert) it writes the logit to
``router_logits`` and publishes the record (sigmoid score, score + bias) as one 64-bit word of
the mailbox. Then CTA t < T consumes: it polls token t's records until every expert's is
published, resets them, and runs ``moe_route``'s routing on them (``MoeRoute.route``), so ids
and weights are those of ``moe_route`` with its sigmoid on the same logits, bit for bit.

The mailbox (``Mailbox``) is [2 parities, MAX_TOKENS, E] words that hold SENTINEL when not
published. A record is canonical first (NaN -> (0, -inf), -0.0 -> +0.0), so its words are never
the sentinel's (0x80000000 is -0.0). The launch reads its parity from ``state[0]``; the last CTA
to have read it advances it (``count_in``), so a captured graph's replays alternate. Consumers
reset their records before the parity comes round again. A wait that runs past ``timeout_ns``
on %globaltimer treats the missing records as (0, -inf), finishes, and sets ``state[2]``;
``check`` raises on the host.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ...kernels import pdl
from ...kernels.compile import Target, cached_kernel, fake_stream, fake_tensor
from ..moe_route.kernel import THREADS, WARPS, MoeRoute
from ..moe_route.scoring import KEY_NONE, canonical, expert_key, scored, sigmoid
from .gemv import MMA_ROWS, MMA_TOKENS, Gemv

MAX_TOKENS = 16  # the most tokens a launch takes (the mailbox's rows a parity); the op's switch is lower
CHUNK = 4  # the most tokens whose hidden vectors a thread holds in registers at a time
MAX_WIDTH = 8192  # the widest hidden the front stages (wider: the GEMM path)
SENTINEL = 0x80000000
UNPUBLISHED = ((SENTINEL << 32) | SENTINEL) - (1 << 64)  # a mailbox word no record can be (as int64)
TIMED_OUT = 1  # state[2]: a consumer's wait ran out
# Opt-in until measured on the GPU (TORCH_SPARSE_DECODE_FRONT_BULK=1): the weights staged by a
# few bulk copies (one a row slice, issued by one warp, each slice's landing counted by an
# mbarrier) instead of 16-byte cp.async by every thread; read at each launch.
BULK = os.environ.get("TORCH_SPARSE_DECODE_FRONT_BULK") == "1"
# Opt-in until measured on the GPU (TORCH_SPARSE_DECODE_FRONT_MMA=1; stages by bulk copies): the
# GEMV on the tensor cores (``gemv.py``); read at each launch.
MMA = os.environ.get("TORCH_SPARSE_DECODE_FRONT_MMA") == "1"
# A profiled build (benchmarks/profile_front.py) stamps %globaltimer at the end of each phase,
# per CTA, into state[4 + cta * len(PHASES) + phase]; other builds compile the stamps out.
# "weights in": thread 0's copies of its weight vectors have landed; "GEMV": its last chunk's FMAs.
PHASES = ("start", "weights in", "GEMV", "published", "records in", "routed", "end")


class Mailbox(NamedTuple):
    words: cute.Tensor  # Int64 [2 * MAX_TOKENS * E]
    state: cute.Tensor  # Int64 [4]: the launch count (its parity), CTAs done, error word, unused
    parity: Int32
    timeout_ns: Int64


@cute.jit
def record_of(logit: Float32, bias: Float32) -> Int64:
    """The published record of a logit: (score bits, then score + bias bits above them), NaN as
    (0, -inf) and -0.0 as +0.0, exactly as ``moe_route`` keys the score."""
    score, key = scored(sigmoid(logit), bias)
    key = canonical(key)
    return (Int64(key.bitcast(Uint32)) << 32) | Int64(score.bitcast(Uint32))


@cute.jit
def word_at(words: cute.Tensor, at: Int32):
    return cute.make_ptr(Int64, (words.iterator + at).toint(), cute.AddressSpace.gmem, assumed_align=8)


class GateFront(Gemv, MoeRoute):
    """The front at one static configuration: E, H, topk, renormalize, groups, CTAs, tokens a
    chunk; ``pdl``: launched as a programmatic dependent of the kernel that writes ``hidden``. Its
    weights are no kernel's output, so their copy to shared memory starts before the wait, under
    that kernel's tail. ``bulk``: the weights staged by bulk copies (``BULK``); ``mma``: the GEMV
    on the tensor cores (``MMA``; staged by bulk copies, ``chunk`` a multiple of MMA_TOKENS)."""

    def __init__(self, experts: int, width: int, topk: int, renormalize: bool, groups: int, topk_group: int,
                 ctas: int, chunk: int, pdl: bool = False, bulk: bool = False, mma: bool = False,
                 profile: bool = False):
        super().__init__(experts, topk, renormalize, True, groups, topk_group, pdl)
        self.profile, self.bulk, self.mma = profile, bulk or mma, mma
        self.width, self.words, self.vecs = width, width // 2, width // 8  # bf16, 32-bit words, 16-byte vectors
        self.per = -(-self.vecs // THREADS)  # a thread's vectors of a row
        self.ctas, self.chunk = ctas, chunk
        self.rows = -(-experts // ctas)  # experts per CTA
        # The warps' partial sums are [WARPS][tile_rows][chunk]: an MMA's rows pad the CTA's.
        self.tile_rows = MMA_ROWS if mma else self.rows
        assert self.tile_rows * chunk <= THREADS
        assert not mma or (chunk % MMA_TOKENS == 0 and self.rows <= MMA_ROWS and width % 32 == 0)

    @cute.jit
    def mark(self, state: cute.Tensor, phase: cutlass.Constexpr[str], cta: Int32, tid: Int32):
        if cutlass.const_expr(self.profile):
            if tid == 0:
                state[4 + cta * len(PHASES) + PHASES.index(phase)] = Int64(cute.arch.globaltimer())

    @cute.jit
    def __call__(self, hidden: cute.Tensor, gate: cute.Tensor, bias: cute.Tensor, scale: Float32,
                 weights: cute.Tensor, ids: cute.Tensor, logits: cute.Tensor, words: cute.Tensor,
                 state: cute.Tensor, timeout_ns: Int64, skip: Int32, stream):
        self.kernel(hidden, gate, bias, scale, weights, ids, logits, words, state, timeout_ns, skip).launch(
            grid=[self.ctas, 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.jit
    def count_in(self, state: cute.Tensor, tid: Int32):
        """Count this CTA in once all its threads have read the parity; the launch's last CTA to
        count in advances it for the next launch. Called with the CTA's copies in flight, so
        the atomic's round trip costs nothing; at the end of the launch its release waited for
        the outputs' stores (0.7-0.9 us between "routed" and "end" in profile_front.py)."""
        cute.arch.sync_threads()
        if tid == 0:
            done = cute.arch.atomic_add(state.iterator + 1, Int64(1), sem="acq_rel", scope="gpu")
            if done == Int64(self.ctas - 1):
                state[1] = Int64(0)
                state[0] = state[0] + Int64(1)

    @cute.jit
    def produce(self, hidden: cute.Tensor, gate: cute.Tensor, bias: cute.Tensor, logits: cute.Tensor,
                staged: cute.Tensor, partial: cute.Tensor, landed: cute.Tensor, box: Mailbox, skip: Int32, cta: Int32,
                tid: Int32):
        """This CTA's experts' logits for every token, published to the mailbox, ``chunk`` tokens
        at a time: the weights come from shared memory (``stage``), the hidden vectors straight
        from global memory into registers, so each weight is read once from HBM and each hidden
        word once per CTA (``gemv_fma`` or ``gemv_mma``); the warps' sums are added in order."""
        warp, lane = tid // 32, tid % 32
        tokens = hidden.shape[0]
        rows, chunk = self.rows, self.chunk
        if cutlass.const_expr(not self.pdl):  # a programmatic dependent has staged them before its wait
            self.stage(gate, staged, landed, cta, tid)
        # The bias of the expert whose records this thread publishes, read now: its round trip
        # hides under the GEMV instead of following the CTA's sums.
        mine = Float32(0.0)
        if tid < rows * chunk:
            mine = bias[min(cta * rows + tid // chunk, self.experts - 1)]
        for first in range(0, tokens, chunk):
            if cutlass.const_expr(self.mma):
                self.gemv_mma(hidden, staged, partial, landed, box.state, first, cta, tid, warp, lane)
            else:
                self.gemv_fma(hidden, staged, partial, landed, box.state, first, cta, tid, warp, lane)
            cute.arch.sync_threads()
            if tid < rows * chunk:
                r, t = tid // chunk, first + tid % chunk
                expert = cta * rows + r
                logit = partial[tid]
                for w in cutlass.range_constexpr(1, WARPS):
                    logit = logit + partial[w * self.tile_rows * chunk + tid]
                if (t < tokens) & (expert < self.experts):
                    logits[t, expert] = logit
                    if expert != skip:  # tests: a record never published
                        at = (box.parity * MAX_TOKENS + t) * self.experts + expert
                        cute.arch.store(word_at(box.words, at), record_of(logit, mine), sem="relaxed",
                                        scope="gpu")

    @cute.jit
    def load_keys(self, box: Mailbox, token: Int32, keys: cute.Tensor, score_of: cute.Tensor, value: cute.Tensor,
                  tid: Int32):
        """Step 1 from the mailbox: poll this thread's experts' records of ``token`` until all are
        published (or the wait runs out: missing ones count as (0, -inf)), then reset them."""
        base = (box.parity * MAX_TOKENS + token) * self.experts
        records = cute.make_rmem_tensor(self.per_thread, Int64)
        for i in cutlass.range_constexpr(self.per_thread):
            records[i] = Int64(UNPUBLISHED)
        start = cute.arch.globaltimer()
        missing = Int32(1)
        while (missing != 0) & (cute.arch.globaltimer() - start < box.timeout_ns):
            missing = Int32(0)
            for i in cutlass.range_constexpr(self.per_thread):
                expert = tid + THREADS * i
                if (expert < self.experts) & (records[i] == Int64(UNPUBLISHED)):
                    word = cute.arch.load(word_at(box.words, base + expert), Int64, sem="relaxed", scope="gpu")
                    published = (Uint32(word & Int64(0xFFFFFFFF)) != Uint32(SENTINEL)) & (
                        Uint32(word >> 32) != Uint32(SENTINEL))
                    if published:
                        records[i] = word
                    else:
                        missing = missing + 1
        self.mark(box.state, "records in", token, tid)  # consumer CTA `token`
        if missing != 0:
            cute.arch.atomic_or(box.state.iterator + 2, Int64(TIMED_OUT))
        for i in cutlass.range_constexpr(self.per_thread):
            expert = tid + THREADS * i
            keys[i] = Int64(KEY_NONE)
            score_of[i] = Float32(0.0)
            if expert < self.experts:
                cute.arch.store(word_at(box.words, base + expert), Int64(UNPUBLISHED))
                score = Float32(0.0)
                key = -Float32.inf
                if records[i] != Int64(UNPUBLISHED):
                    score = Uint32(records[i] & Int64(0xFFFFFFFF)).bitcast(Float32)
                    key = Uint32(records[i] >> 32).bitcast(Float32)
                keys[i] = expert_key(key, expert)
                score_of[i] = score
                if cutlass.const_expr(self.groups > 1):
                    value[expert] = key

    def shared(self):
        """The shared memory allocator, the CTA's weight rows, the warps' partial sums and the
        slices' mbarriers (the routing allocates after them)."""
        smem = cutlass.memory.SmemAllocator()
        staged = smem.allocate_tensor(Uint32, cute.make_layout(self.rows * self.words), 16)
        partial = smem.allocate_tensor(Float32, cute.make_layout(WARPS * self.tile_rows * self.chunk), 16)
        landed = partial  # not read without bulk copies (whose builds allocate it)
        if cutlass.const_expr(self.bulk):
            landed = smem.allocate_tensor(Int64, cute.make_layout(self.per), 8)
        return smem, staged, partial, landed

    @cute.kernel
    def kernel(self, hidden: cute.Tensor, gate: cute.Tensor, bias: cute.Tensor, scale: Float32,
               weights: cute.Tensor, ids: cute.Tensor, logits: cute.Tensor, words: cute.Tensor,
               state: cute.Tensor, timeout_ns: Int64, skip: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        self.mark(state, "start", cta, tid)
        if cutlass.const_expr(self.pdl):
            smem, staged, partial, landed = self.shared()
            self.stage(gate, staged, landed, cta, tid)
            cute.arch.griddepcontrol_wait()  # hidden, and the parity a front before may have advanced
            cute.arch.griddepcontrol_launch_dependents()
        box = Mailbox(words, state, Int32(state[0] & Int64(1)), timeout_ns)
        if cutlass.const_expr(not self.pdl):
            smem, staged, partial, landed = self.shared()
        self.produce(hidden, gate, bias, logits, staged, partial, landed, box, skip, cta, tid)
        self.mark(state, "published", cta, tid)
        if cta < hidden.shape[0]:
            self.route(smem, box, cta, scale, weights, ids, tid)
            self.mark(state, "routed", cta, tid)
        self.mark(state, "end", cta, tid)


def catalog(target: Target) -> list[tuple]:
    """The front of each model we serve whose weight rows fit a launch's shared memory, at every
    chunk of tokens (``chunk_for``), on a GPU of ``target.sms`` SMs; a programmatic dependent
    where ``pdl.enabled(pdl.FRONT)`` says so, staging by bulk copies where ``BULK`` does, on the
    tensor cores where ``MMA`` does."""
    configs, dependent = [], pdl.enabled(pdl.FRONT)
    for model in target.models:
        ctas = ctas_for(model.experts, target.sms)
        groups, kept = model.grouping
        if fits(model.experts, model.hidden, ctas, MMA):  # as the op asks (moe_gate_route's uses_front)
            for chunk in sorted({chunk_for(tokens, MMA) for tokens in range(1, MAX_TOKENS + 1)}):
                configs.append((model.experts, model.hidden, model.topk, model.renormalize, groups, kept, ctas, chunk,
                                dependent, *switches()))
    return configs


@cached_kernel("moe_gate_route", catalog)
def compiled(experts: int, width: int, topk: int, renormalize: bool, groups: int, topk_group: int, ctas: int,
             chunk: int, pdl: bool = False, bulk: bool = False, mma: bool = False, profile: bool = False):
    """The front at one static configuration, from fake tensors (no GPU needed). ``hidden`` and
    ``gate`` are passed as int32 words (two bf16 each); a ``profile`` build's state has its phase
    stamps after the four words."""
    tokens = cute.sym_int()
    hidden = fake_tensor(Int32, (tokens, width // 2), (width // 2, 1), 16)
    gate = fake_tensor(Int32, (experts, width // 2), (width // 2, 1), 16)
    bias = fake_tensor(Float32, (experts,), (1,))
    weights = fake_tensor(Float32, (tokens, topk), (topk, 1))
    ids = fake_tensor(Int32, (tokens, topk), (topk, 1))
    logits = fake_tensor(Float32, (tokens, experts), (experts, 1))
    words = fake_tensor(Int64, (2 * MAX_TOKENS * experts,), (1,), 8)
    state = fake_tensor(Int64, (4 + (ctas * len(PHASES) if profile else 0),), (1,), 8)
    front = GateFront(experts, width, topk, renormalize, groups, topk_group, ctas, chunk, pdl, bulk, mma, profile)
    return cute.compile(front, hidden, gate, bias, Float32(1.0), weights, ids, logits, words, state, Int64(1),
                        Int32(-1), fake_stream(), options="--enable-tvm-ffi")


def switches() -> tuple[bool, bool]:
    """(bulk, mma) as a launch asks for them now (``BULK``, ``MMA``): an MMA build always stages by
    bulk copies, so it is asked for with bulk False, one build whichever switches are on."""
    return BULK and not MMA, MMA


def chunk_for(tokens: int, mma: bool = False) -> int:
    """Tokens per chunk: the batch's power of two up to CHUNK (FMAs scale with it); on the tensor
    cores, the batch in MMAs of MMA_TOKENS columns (at most MAX_TOKENS)."""
    if mma:
        return MMA_TOKENS * -(-min(tokens, MAX_TOKENS) // MMA_TOKENS)
    return min(CHUNK, 1 << max(tokens - 1, 0).bit_length())


SMEM_LIMIT = 227 * 1024  # shared memory a launch may use (one CTA per SM on SM90)
ROUTING_SMEM = MoeRoute.SMEM_BYTES  # the routing's arrays after the front's own


def smem_bytes(experts: int, width: int, ctas: int, chunk: int, mma: bool = False) -> int:
    """Shared memory of a launch: the CTA's weight rows, the warps' partial sums, the slices'
    mbarriers, the routing."""
    rows = -(-experts // ctas)
    tile_rows = MMA_ROWS if mma else rows
    return rows * width * 2 + WARPS * tile_rows * chunk * 4 + 8 * -(-width // (8 * THREADS)) + ROUTING_SMEM


def fits(experts: int, width: int, ctas: int, mma: bool = False) -> bool:
    """Whether a launch can take the batch's shapes, at its largest chunk: rows read as 16-byte
    vectors (32-column blocks on the tensor cores, whose rows hold a CTA's experts), at most
    MAX_WIDTH wide, and the CTA's weight rows in shared memory."""
    rows = -(-experts // ctas)
    if mma and (width % 32 or rows > MMA_ROWS):
        return False
    chunk = chunk_for(MAX_TOKENS, mma)
    return width % 8 == 0 and width <= MAX_WIDTH and smem_bytes(experts, width, ctas, chunk, mma) <= SMEM_LIMIT


def ctas_for(experts: int, sms: int) -> int:
    """CTAs of a launch: at most one per SM (co-resident, so no consumer waits on a producer that
    cannot start), as few as leave every CTA the same number of experts."""
    rows = -(-experts // sms)
    return -(-experts // rows)


class Workspace(NamedTuple):
    words: torch.Tensor
    state: torch.Tensor


def workspace(device: torch.device, experts: int) -> Workspace:
    """A fresh mailbox (every word unpublished) and state, for one device and expert count."""
    words = torch.full((2 * MAX_TOKENS * experts,), UNPUBLISHED, dtype=torch.int64, device=device)
    return Workspace(words, torch.zeros(4, dtype=torch.int64, device=device))
