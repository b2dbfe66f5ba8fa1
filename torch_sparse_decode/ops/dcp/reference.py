"""The exact pure-torch references of the DCP ops: their CPU kernels and the test oracle's subject.

Each function has its op's signature (``torch.ops.sparse_decode.<name>``) and writes into the
caller-owned outputs, ranking through the library's one order. Written for clarity and exactness,
not speed. (``dcp_topk_merge``, a step over a process group, is ``group.generic_step``: these
references are its local parts.)
"""

from __future__ import annotations

import torch

from ...order import ascending_ids, bf16_ord16, clamped_lengths, topk_by_key
from .config import WARP, packed_row_slots


# ------------------------------------------------------------------------ DCP decode top-k merge
#
# Candidate keys of the merge: ord16 of the bf16-rounded score in bits 32..47, the complement of
# the 32-bit global id below, so a larger key is better and equal scores go to the lower id.
# Empty candidates are -1 (a live key is at least ord16(-inf) << 32 > 0).

EMPTY = -1


def _dcp_key(ord16: torch.Tensor, global_id: torch.Tensor) -> torch.Tensor:
    return (ord16 << 32) | (0xFFFFFFFF - global_id)


def _key_global_id(key: torch.Tensor) -> torch.Tensor:
    return 0xFFFFFFFF - (key & 0xFFFFFFFF)


def _local_topk(scores: torch.Tensor, lengths: torch.Tensor, topk: int):
    """The rank's best ``topk`` local tokens in merge order: (ord16, local index, live), best first."""
    length = scores.shape[1]
    ends = clamped_lengths(lengths, length)
    local = torch.arange(length, device=scores.device)
    ord16 = bf16_ord16(scores)
    keys = torch.where(local < ends[:, None], _dcp_key(ord16, local), EMPTY)
    best, index = topk_by_key(keys, topk)
    live = best != EMPTY
    pad = topk - index.shape[1]
    if pad:
        fill = index.new_zeros(index.shape[0], pad)
        index, live = torch.cat([index, fill], 1), torch.cat([live, fill.bool()], 1)
    # A row of no local tokens has no key to gather (every slot is empty).
    picked = ord16.gather(1, index) if length else torch.zeros_like(index)
    return picked, index, live


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same bits."""
    return (words - ((words >> 31) << 32)).to(torch.int32)


def _encode_b_prime(ord16: torch.Tensor, local: torch.Tensor, live: torch.Tensor, slots: int) -> torch.Tensor:
    """A B' row (docs/dcp.md) with ``slots`` slots (a multiple of 32): candidate words, then bit planes."""
    rows, count = ord16.shape
    words = torch.zeros(rows, slots, dtype=torch.int64, device=ord16.device)
    planes = torch.zeros(rows, slots, dtype=torch.int64, device=ord16.device)
    word = (ord16 << 16) | (0xFFFF - (local & 0xFFFF))
    words[:, :count] = torch.where(live, word, 0)
    planes[:, :count] = torch.where(live, (local >> 16) & 1, 0)
    shifts = torch.arange(WARP, device=ord16.device)
    plane_words = (planes.view(rows, slots // WARP, WARP) << shifts).sum(dim=2)
    return _as_int32(torch.cat([words, plane_words], dim=1))


def decode_b_prime(row: torch.Tensor, slots: int):
    """Inverse of the B' layout: (ord16, local index, live) per slot, int64/bool [..., slots]."""
    row = row.to(torch.int64) & 0xFFFFFFFF
    words, plane_words = row[..., :slots], row[..., slots:]
    slot = torch.arange(slots, device=row.device)
    bit16 = (plane_words[..., slot // WARP] >> (slot % WARP)) & 1
    local = (0xFFFF - (words & 0xFFFF)) | (bit16 << 16)
    return words >> 16, local, words != 0


def dcp_pack(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    world_size: int,
    rank: int,
    topk: int,
    packed: torch.Tensor,
    rescue: torch.Tensor,
) -> None:
    """The rank's packed B' row of its best N candidates, and its local top-K (rescue row)."""
    n = packed_row_slots(packed.shape[1])
    deep_slots = packed_row_slots(rescue.shape[1])  # the rescue row: the local top-K
    ord16, local, live = _local_topk(scores, lengths, topk)
    packed.copy_(_encode_b_prime(ord16[:, :n], local[:, :n], live[:, :n], n))
    rescue.copy_(_encode_b_prime(ord16, local, live, deep_slots))


def _emit(keys, topk, world_size, rank, global_ids, local_ids, local_count) -> None:
    """Global top-``topk`` of candidate keys (-1 = empty) -> ascending global and own local ids."""
    best, _ = topk_by_key(keys, topk)
    live = best != EMPTY
    global_id = _key_global_id(best)
    global_ids.copy_(ascending_ids(global_id, live, topk))
    mine = live & (global_id % world_size == rank)
    local_ids.copy_(ascending_ids(global_id // world_size, mine, topk))
    local_count.copy_(mine.sum(dim=1))


def _candidate_keys(rows: torch.Tensor, slots: int, world_size: int) -> torch.Tensor:
    """[W, T, words] B' rows -> [W, T, slots] merge keys on global ids, -1 where empty."""
    ord16, local, live = decode_b_prime(rows, slots)
    rank = torch.arange(world_size, device=rows.device).view(world_size, 1, 1)
    return torch.where(live, _dcp_key(ord16, local * world_size + rank), EMPTY)


def saturated_ranks(gathered: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sent candidate keys [W, T, N] and which ranks are saturated [W, T] (see ``dcp_merge``)."""
    world_size, rows, words = gathered.shape
    n = packed_row_slots(words)
    sent = _candidate_keys(gathered, n, world_size)
    union = sent.permute(1, 0, 2).reshape(rows, world_size * n)
    if union.shape[1] >= topk:
        threshold = torch.topk(union, topk, dim=1).values[:, -1]
    else:
        threshold = torch.full((rows,), EMPTY, dtype=torch.int64, device=gathered.device)
    full = (sent != EMPTY).all(dim=2)
    lowest_sent = torch.where(sent != EMPTY, sent, torch.iinfo(torch.int64).max).amin(dim=2)
    return sent, full & (lowest_sent > threshold[None, :])


def dcp_merge(
    gathered: torch.Tensor,
    rescue: torch.Tensor,
    topk: int,
    rank: int,
    global_ids: torch.Tensor,
    local_ids: torch.Tensor,
    local_count: torch.Tensor,
) -> None:
    """One-round merge of every rank's packed row, rescuing saturated ranks.

    t0 is the K-th key of the union of the sent candidates (or none when the union is smaller than
    K). A rank that sent a full row whose every candidate ranks above t0 is saturated, and its sent
    row is replaced by its local top-K (its rescue row); the global top-K is in that candidate set.
    """
    world_size, rows, _ = gathered.shape
    sent, saturated = saturated_ranks(gathered, topk)
    deeper = _candidate_keys(rescue, packed_row_slots(rescue.shape[2]), world_size)
    # A saturated rank contributes only its rescue row (a superset of what it sent).
    sent = torch.where(saturated[:, :, None], EMPTY, sent)
    deeper = torch.where(saturated[:, :, None], deeper, EMPTY)
    candidates = torch.cat([sent, deeper], dim=2)
    candidates = candidates.permute(1, 0, 2).reshape(rows, world_size * candidates.shape[2])
    _emit(candidates, topk, world_size, rank, global_ids, local_ids, local_count)


def dcp_local_keys(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    world_size: int,
    rank: int,
    topk: int,
    keys: torch.Tensor,
) -> None:
    """The rank's local top-K as int64 merge keys on global ids (-1 = empty): the generic exchange."""
    ord16, local, live = _local_topk(scores, lengths, topk)
    keys.copy_(torch.where(live, _dcp_key(ord16, local * world_size + rank), EMPTY))


def dcp_merge_generic(
    gathered_keys: torch.Tensor,
    rank: int,
    global_ids: torch.Tensor,
    local_ids: torch.Tensor,
    local_count: torch.Tensor,
) -> None:
    """Generic merge: the global top-K of every rank's full local top-K keys [W, T, K]."""
    world_size, rows, topk = gathered_keys.shape
    candidates = gathered_keys.permute(1, 0, 2).reshape(rows, world_size * topk)
    _emit(candidates, topk, world_size, rank, global_ids, local_ids, local_count)
