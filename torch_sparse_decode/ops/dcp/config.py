"""Configuration helpers of the one-round DCP decode top-k merge (the B' layout and its sizes).

Import-light on purpose: model construction asks these before any kernel exists.

Packed candidate rows (the "B'" layout of docs/dcp.md), int32 [T, N + N/32] per rank, N a multiple of 32,
local index ``l`` < 2**17 (global id ``l * W + rank``):

- word j < N: ``(ord16(s) << 16) | (0xFFFF - (l & 0xFFFF))`` as uint32, ``s`` the bf16 score bits
  (rounded to nearest even, then NaN as -inf and -0.0 as +0.0); 0 is an empty slot; any order;
- word N + j // 32, bit j % 32: bit 16 of ``l`` for candidate j.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WORLD_SIZE = 16
# What is built ahead of time: the DSA decode's K over a node's DCP groups (the merge's catalog,
# the pack's Triton warm-up).
BUILT_WORLD_SIZES = (2, 4, 8)
BUILT_TOPK = 2048
LOCAL_INDEX_BITS = 17
WARP = 32  # B' plane words hold one bit per slot of a warp's 32

# The one-round merge's kernels address the symmetric workspace with 32-bit word offsets.
MAX_WORKSPACE_WORDS = (1 << 31) - 1

# A step's tag, in every 8-byte unit a step writes (the word, then the tag): the step's sequence
# number (its low 15 bits) above its row count, never 0, so a reader tells this step's units from
# an earlier step's and from a peer's step of other rows.
TAG_SEQ_MASK = 0x7FFF
TAG_ROWS_BITS = 16
TAG_ROWS_MASK = (1 << TAG_ROWS_BITS) - 1
# The workspace's state[3] (when the step's first wait began) while no wait of the step has begun.
NO_WAIT = 0x7FFFFFFFFFFFFFFF

# The bound on one dcp_topk_merge step's waits for its peers, unless init_dcp_topk_merge set another.
STEP_TIMEOUT_S = 5.0


@dataclass
class DcpGroup:
    """What ``init_dcp_topk_merge`` agreed for one (process group, topk): the one owner of a
    group's DCP state. ``local_topk`` is N (0: the generic merge); ``workspace`` the one-round
    step's symmetric-memory workspace (None on the generic merge)."""

    name: str
    topk: int
    local_topk: int
    max_rows: int
    max_local_len: int | None
    timeout_s: float
    workspace: object = None

    @property
    def arguments(self) -> tuple:
        """The init arguments a repeated call must match."""
        return self.max_rows, self.max_local_len, self.timeout_s


# (group name, topk) -> its DcpGroup, filled by init_dcp_topk_merge.
GROUPS: dict[tuple[str, int], DcpGroup] = {}


def dcp_group(group, topk: int) -> DcpGroup | None:
    """``group``'s (a process group or its name) state for ``topk``, or None before init."""
    return GROUPS.get((getattr(group, "group_name", group), topk))


def step_timeout_s(group_name: str, topk: int) -> float:
    """Seconds a step of ``group_name`` at ``topk`` waits for its peers before it raises."""
    state = GROUPS.get((group_name, topk))
    return state.timeout_s if state is not None else STEP_TIMEOUT_S


def dcp_merge_local_topk(topk: int, world_size: int) -> int:
    """Per-rank candidate count N: 1.5x the fair share ``topk / world_size``, warp-aligned.

    0 when it would not be smaller than ``topk`` (then the one-round merge saves nothing)."""
    fair_share = -(-topk // world_size)
    local_topk = -(-(3 * fair_share) // (2 * WARP)) * WARP
    return local_topk if local_topk < topk else 0


def packed_row_words(local_topk: int) -> int:
    """int32 words per packed row: N candidate words + N/32 bit-plane words."""
    return local_topk + local_topk // WARP


def packed_row_slots(words: int) -> int:
    """The inverse of ``packed_row_words``: the slots of a packed row of ``words`` int32 words."""
    return words * WARP // (WARP + 1)


def max_saturated_ranks(topk: int, local_topk: int) -> int:
    """Upper bound on the saturated ranks of one row (the ranks whose rescue row a merge may read).

    A saturated rank sent N candidates, all strictly above the K-th selected key, so they are
    among the K - 1 keys above it: at most ``(K - 1) // N`` such ranks."""
    return (topk - 1) // local_topk


def dcp_topk_merge_max_rows(topk: int, local_topk: int, group=None) -> int:
    """Rows one merge call may hold: ``group``'s (a process group or its name) ``max_rows``, or
    without it the smallest over every group set up with this (topk, local_topk), so that a step
    that fits fits on each of them. 0 when no such group was set up."""
    name = getattr(group, "group_name", group)
    rows = [g.max_rows for g in GROUPS.values()
            if g.topk == topk and g.local_topk == local_topk and name in (None, g.name)]
    return min(rows, default=0)


def dcp_topk_merge_fits(num_rows: int, topk: int, local_topk: int, group=None) -> bool:
    """Whether a step of ``num_rows`` rows takes the one-round merge (the same on every rank of
    the group; the step's local length must also be <= the ``max_local_len`` the group was set up
    with). ``group`` as for ``dcp_topk_merge_max_rows``: the kernel asks with its group's name."""
    return local_topk > 0 and num_rows <= dcp_topk_merge_max_rows(topk, local_topk, group)


def workspace_words(world_size: int, topk: int, local_topk: int, max_rows: int) -> int:
    """int32 words of a rank's one-round workspace: two parities of every rank's packed rows and
    of its own rescue rows, each word stored as an 8-byte tagged unit."""
    return 2 * max_rows * 2 * (world_size * packed_row_words(local_topk) + packed_row_words(rescue_row_slots(topk)))


def rescue_row_slots(topk: int) -> int:
    """Slots of a rank's rescue row (its local top-K in the B' layout): K rounded up to 32."""
    return -(-topk // WARP) * WARP
