"""The merge's reads in a step (CuTe DSL): tagged units, the bounded wait, and where a merge finds
its rows (``Rows``; the ``RowReads`` methods of ``merge.DcpMerge``).

A step's rows arrive as 8-byte units (a B' word, then the step's tag, ``config.TAG_SEQ_MASK``;
no flag). A reader knows a unit of the step has arrived when it carries the step's tag, reads it
at system scope (a peer's stores may land while it polls), and gives up ``timeout_ns`` after the
step's first wait began (``state[3]``), whatever the rows, ranks and waves of CTAs. A simulated
merge (no step) reads plain int32 rows instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .config import TAG_ROWS_BITS, TAG_ROWS_MASK, TAG_SEQ_MASK

# The CTA's info words (shared): digit found, keys above it, keys wanted, the error word's bits of
# the rows that did not arrive (0: all did), the highest live id.
DIGIT, ABOVE, NEED, LATE, TOP = range(5)


@cute.jit
def load_unit(base: Int64, j: Int32) -> Int64:
    """Tagged unit j (8 bytes: the word, then its tag) of the row at ``base``, read at system scope
    (a peer's stores may land while the CTA polls: no stale cached copy)."""
    ptr = cute.make_ptr(Int64, base + Int64(j) * 8, cute.AddressSpace.gmem, assumed_align=8)
    return cute.arch.load(ptr, Int64, sem="relaxed", scope="sys")


@cute.jit
def tag_of(unit: Int64) -> Int32:
    return Int32(unit >> 32)


@cute.jit
def step_tag(seq: Int64, rows: Int32) -> Int32:
    """A step's tag (as the pack writes it, ``config.TAG_SEQ_MASK``): the sequence, then the row count."""
    return (Int32(seq & Int64(TAG_SEQ_MASK)) << TAG_ROWS_BITS) | rows


@cute.jit
def of_no_step(tag: Int32, want: Int32):
    """Whether a unit with ``tag`` is not of the step that wants ``want`` (yet): an earlier step's,
    or never written. Another tag than ``want`` that is of the step comes from a peer whose step
    has another row count: waiting will not change it."""
    return ((tag >> TAG_ROWS_BITS) != (want >> TAG_ROWS_BITS)) | ((tag & Int32(TAG_ROWS_MASK)) == Int32(0))


@cute.jit
def wait_began(state: cute.Tensor) -> Int64:
    """When the step's first wait began (now, if this is it): every wait of a step ends one bound
    after it, whatever the rows, ranks and waves of CTAs."""
    now = cute.arch.globaltimer()
    first = cute.arch.atomic_min(state.iterator + 3, now)
    return cutlass.select_(first < now, first, now)


@cute.jit
def global_row(address: Int64) -> cute.Tensor:
    """int32 words at a raw global address (a peer's buffer from the address table)."""
    ptr = cute.make_ptr(Int32, address, cute.AddressSpace.gmem, assumed_align=4)
    return cute.make_tensor(ptr, cute.make_layout(1 << 30))


@dataclass(frozen=True)
class Rows:
    """Where a merge reads its rows: the sent rows at word ``sent_at`` of ``gathered`` (rank r's
    ``r * rank_stride`` further), rank r's rescue row at word ``rescue_at`` of its buffer
    (``peers[r]``); in a step also the step's tag, the wait's bound, the CTA's ``info`` words and
    the group's ``state``."""

    gathered: cute.Tensor
    sent_at: Int32
    rank_stride: Int32
    peers: cute.Tensor
    rescue_at: Int32
    want: Int32
    timeout_ns: Int64
    info: cute.Tensor
    state: cute.Tensor


class RowReads:
    """How a merge reads rank r's B' rows: plain words, or in a step (``self.exchange``) tagged
    units polled up to the step's bound. Needs ``exchange``, ``W``, ``N``, ``R`` and ``threads``."""

    @cute.jit
    def row_base(self, gathered: cute.Tensor, at: Int32) -> Int64:
        """The address of the row at int32 word ``at`` of ``gathered``."""
        return Int64((gathered.iterator + at).toint())

    @cute.jit
    def arrived_word(self, base: Int64, j: Int32) -> Int32:
        """Word j of the B' row at ``base`` (in a step: of a unit already seen with the step's tag;
        read at system scope all the same, so no copy cached before it landed is used)."""
        if cutlass.const_expr(self.exchange):
            return Int32(load_unit(base, j))
        else:
            return global_row(base)[j]

    @cute.jit
    def word(self, base: Int64, j: Int32, src: Rows, r) -> Int32:
        """Word j of rank r's B' row at ``base``; in a step (tagged units) once its unit carries
        the step's tag, polled up to the step's bound (else info[LATE] gets rank r's bit, one for
        late or one for another row count, and the word reads 0)."""
        if cutlass.const_expr(self.exchange):
            want, timeout_ns, info, state = src.want, src.timeout_ns, src.info, src.state
            unit = load_unit(base, j)
            if tag_of(unit) != want:
                start = wait_began(state)
                while of_no_step(tag_of(unit), want) & (cute.arch.globaltimer() - start < timeout_ns):
                    unit = load_unit(base, j)  # (info is not read here: other threads may be setting it)
                if tag_of(unit) != want:
                    bit = cutlass.select_(of_no_step(tag_of(unit), want), Int32(1) << r, Int32(1) << (16 + r))
                    cute.arch.atomic_or(info.iterator + LATE, bit)
                    unit = Int64(0)
            return Int32(unit)
        else:
            return global_row(base)[j]

    @cute.jit
    def wait_rescued(self, src: Rows, saturated: Int32, tid: Int32):
        """In a step: every unit of the saturated ranks' rescue rows, polled until it carries the
        step's tag (``word``; the CTA's threads split the units)."""
        for r in range(self.W):
            if ((saturated >> r) & 1) != 0:
                base = src.peers[r] + Int64(src.rescue_at) * 4
                for u in range(tid, self.R + self.R // 32, self.threads):
                    self.word(base, u, src, r)

    @cute.jit
    def load_sent(self, gathered: cute.Tensor, sent_at: Int32, rank_stride: Int32, want: Int32, keys: cute.Tensor,
                  gids: cute.Tensor, tid: Int32) -> Int32:
        """The sent rows' words of this thread's slots (tid, tid + self.threads, ...; the W rows laid end
        to end) into ``keys`` and their plane words into ``gids``, every load in flight before the
        first use. In a step: the ranks (a bit each) whose units lacked the step's tag."""
        late = Int32(0)
        for i in cutlass.range_constexpr(self.per):
            f = min(i * self.threads + tid, Int32(self.W * self.N - 1))
            r = f // self.N
            j = f - r * self.N
            at = sent_at + r * rank_stride
            if cutlass.const_expr(self.exchange):
                base = self.row_base(gathered, at)
                unit = load_unit(base, j)
                plane = load_unit(base, self.N + j // 32)
                keys[i] = Int32(unit)
                gids[i] = Int32(plane)
                late = late | (Int32((tag_of(unit) != want) | (tag_of(plane) != want)) << r)
            else:
                keys[i] = gathered[at + j]
                gids[i] = gathered[at + self.N + j // 32]
        return late
