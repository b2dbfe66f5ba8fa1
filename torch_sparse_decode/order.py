"""The library's one total order over ``(score, id)`` pairs.

1. canonicalize the score: NaN becomes -inf, -0.0 becomes +0.0;
2. larger score first;
3. on equal scores, the lower id first.

Every reference in this package ranks through these helpers, so every op selects the same set for
the same input. The composite keys are int64 and unique per id, so ``torch.topk`` over them has no
ties left to break and its result does not depend on the algorithm behind it.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

__all__ = [
    "canonical",
    "ordered_bits",
    "composite_key",
    "bf16_ord16",
    "KEY_NONE",
    "topk_by_key",
    "ascending_ids",
]

# Below every live composite key (a live key's high half is at least ordered_bits(-inf) - 2**31).
KEY_NONE = torch.iinfo(torch.int64).min


def canonical(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of ``x`` with NaN -> -inf and -0.0 -> +0.0 (bf16 widens to fp32 exactly)."""
    x = x.float()
    # Adding +0.0 turns -0.0 into +0.0 and leaves every other value unchanged.
    return torch.where(torch.isnan(x), float("-inf"), x) + 0.0


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving map of canonical fp32 scores onto int64 in [0, 2**32): larger is better."""
    bits = x.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    negative = bits >= 0x80000000
    return torch.where(negative, 0xFFFFFFFF - bits, bits | 0x80000000)


def composite_key(score: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 key ranking ``(score, id)`` pairs in the library order; ``score`` must be canonical.

    High 32 bits: the ordered score bits (shifted into the signed range); low 32 bits: the
    complement of the id, so that on equal scores the lower id gets the larger key.
    """
    ids = ids.to(torch.int64)
    return ((ordered_bits(score) - (1 << 31)) << 32) | (0xFFFFFFFF - ids)


def bf16_ord16(x: torch.Tensor) -> torch.Tensor:
    """The DCP merge's ord16 of scores rounded to bf16 (round to nearest even), then canonical, as int64.

    Canonicalized after the rounding: a tiny negative fp32 rounds to bf16 -0.0, which must tie
    +0.0. ``ord16(s) = s | 0x8000`` for a clear sign bit, ``~s & 0xFFFF`` otherwise.
    """
    rounded = canonical(x.to(torch.bfloat16)).to(torch.bfloat16)
    bits = rounded.view(torch.int16).to(torch.int64) & 0xFFFF
    return torch.where(bits >= 0x8000, 0xFFFF - bits, bits | 0x8000)


def topk_by_key(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``min(k, n)`` keys of each row, best first: (keys, column indices).

    Columns whose key is ``KEY_NONE`` are never live; their slots come back as ``KEY_NONE``.
    """
    n = keys.shape[-1]
    if n == 0 or k == 0:
        empty = keys.new_empty(keys.shape[:-1] + (0,))
        return empty, empty
    values, index = torch.topk(keys, min(k, n), dim=-1, largest=True, sorted=True)
    return values, index


def ascending_ids(ids: torch.Tensor, live: torch.Tensor, k: int) -> torch.Tensor:
    """Rows of ``ids`` where ``live``, sorted ascending, then -1 padding, as int32 [rows, k]."""
    rows = ids.shape[0]
    out = torch.full((rows, k), -1, dtype=torch.int32, device=ids.device)
    if ids.shape[-1] == 0:
        return out
    big = torch.iinfo(torch.int64).max
    ordered, _ = torch.sort(torch.where(live, ids.to(torch.int64), big), dim=-1)
    ordered = torch.where(ordered == big, -1, ordered).to(torch.int32)
    width = min(k, ordered.shape[-1])
    out[:, :width] = ordered[:, :width]
    return out


# Valid-prefix selection, shared by the top-k references.


def ascending_topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Column ids of the best ``k`` live keys of each row (``KEY_NONE`` = not live), ascending."""
    best, index = topk_by_key(keys, k)
    return ascending_ids(index, best != KEY_NONE, k)


def prefix_keys(scores: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Composite keys of each row's columns, ``KEY_NONE`` at and beyond ``ends`` (already clamped)."""
    columns = torch.arange(scores.shape[1], device=scores.device)
    keys = composite_key(canonical(scores), columns)
    return torch.where(columns < ends[:, None], keys, KEY_NONE)


def clamped_lengths(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return lengths.to(torch.int64).clamp(0, width)


def windows(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's window of columns [start, end) moved to column 0, and its length. ``end`` is
    clamped to [0, width] and ``start`` to [0, end] (a start past the end: an empty window);
    columns past a window's length hold copies of the row's last column (callers mask them)."""
    width = x.shape[1]
    end = clamped_lengths(ends, width)
    start = torch.minimum(starts.to(torch.int64).clamp(min=0), end)
    if width == 0:
        return x, end - start
    columns = (start[:, None] + torch.arange(width, device=x.device)).clamp(max=width - 1)
    return x.gather(1, columns), end - start


CHUNK_ELEMENTS = 1 << 22  # a top-k reference's per-column temporaries: rows taken this many columns at a time


def by_row_chunks(reference: Callable[..., None]) -> Callable[..., None]:
    """``reference(scores, ...)`` run over chunks of rows, so its temporaries (int64 keys of every
    column, windows) stay near CHUNK_ELEMENTS elements: the CPU takes the largest batches the
    ops accept (65535 rows of 2**20 columns) in bounded memory. Every tensor argument is per row."""

    @functools.wraps(reference)
    def run(scores: torch.Tensor, *args, **kwargs) -> None:
        rows, width = scores.shape
        step = max(1, CHUNK_ELEMENTS // max(width, 1))
        if rows <= step:
            return reference(scores, *args, **kwargs)
        for first in range(0, rows, step):
            part = slice(first, first + step)

            def cut(a):
                return a[part] if isinstance(a, torch.Tensor) else a

            reference(scores[part], *map(cut, args), **{k: cut(v) for k, v in kwargs.items()})

    return run
