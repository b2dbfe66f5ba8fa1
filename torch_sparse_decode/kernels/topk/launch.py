"""Launch policy: the cluster size a batch takes, and the call of the engine for the ops."""

from __future__ import annotations

import functools

import torch

from ...dtypes import BLOCK_KEYS, DCP_SCORES, TOPK_SCORES
from .. import pdl
from . import short_row
from .engine import compiled
from .layout import MAX_CLUSTER, SPAN_PER_CTA


def cluster_size(rows: int, keys_per_row: int, sms: int) -> int:
    """CTAs per row: one per 8K keys up to 8, while every row's cluster fits the GPU at once.

    The engine's registers (over 64 per thread) leave room for one 512-thread CTA per SM, and a
    cluster must sit in one GPC, so clusters of 4 and 8 fit about half as often as ``sms / S``
    (H200, measured: 32 rows x 4 CTAs and 64 x 8 ran in two waves, 64 x 2 and 8 x 8 in one)."""
    ctas = 1
    while ctas < MAX_CLUSTER and ctas * SPAN_PER_CTA < keys_per_row:
        wider = 2 * ctas
        if rows * wider > (sms if wider <= 2 else sms // 2):
            break
        ctas = wider
    return ctas


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


_NONE: dict = {}  # (device, dtype) -> an empty [0, 0] tensor: the kernel's stand-in for an absent output


def _none(like: torch.Tensor) -> torch.Tensor:
    key = (like.device, like.dtype)
    if key not in _NONE:
        _NONE[key] = torch.empty(0, 0, dtype=like.dtype, device=like.device)  # no memory: graph-safe
    return _NONE[key]


def short_row_build(src: torch.Tensor, pinned: bool, ord16: bool, fused: bool, dependent: bool) -> tuple | None:
    """The short-row select's build a batch takes (``short_row.build_for``), or None where it takes
    the engine: the path is off (``short_row.SHORT_ROWS``), the source is not one it ranks (scores
    by their bits, or by their ord16 where the DCP pack's scores; block keys where ``pinned``), or
    its rows are wider than ``short_row.widest`` or than a wide build that fits. A shape test, the
    same in every replay."""
    rows, key_cols = src.shape
    if not short_row.SHORT_ROWS or key_cols > short_row.widest(fused):
        return None
    if (src.dtype is not BLOCK_KEYS) if pinned else (src.dtype not in (DCP_SCORES if ord16 else TOPK_SCORES)):
        return None
    sms = sm_count(src.device) if short_row.clusters_for(fused) else 0  # one CTA a row: no SM count asked
    return short_row.build_for(src.dtype, dependent, key_cols, rows, sms, ord16, fused)


def select(src: torch.Tensor, lengths: torch.Tensor, cols: int, block: int, k_sel: int, out: torch.Tensor,
           pinned: bool, ord16: bool = False, starts: torch.Tensor | None = None, table: torch.Tensor | None = None,
           page: int = 0, raw: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
    """Row r selects over columns [starts[r], lengths[r]) (clamped to [0, cols]; without
    ``starts``, from 0), ids counted from the window's start. Token sources are read from there;
    block keys (``pinned``) hold the window's blocks from 0. With ``table`` and ``page`` > 0,
    ``out`` gets each id through the table (``Outputs``); ``raw`` the ids themselves; ``values``
    (token sources) the selected scores."""
    rows = out.shape[0]
    if rows == 0:
        return
    windowed = starts is not None
    want = int(raw is not None) | 2 * int(values is not None)
    fused = table is not None or want != 0
    outputs = (_none(out) if raw is None else raw, out if table is None else table, page if table is not None else 0,
               _none(src) if values is None else values, want)  # stand-ins where absent: never read
    dependent = pdl.enabled(pdl.for_keys(ord16))
    config = short_row_build(src, pinned, ord16, fused, dependent)
    if config is not None:
        kernel = short_row.compiled(*config)
    else:
        kernel = compiled(src.dtype, pinned, cluster_size(rows, src.shape[1], sm_count(src.device)), ord16,
                          fused=fused, pdl=dependent)
    kernel(src, lengths, starts if windowed else lengths, int(windowed), cols, block, k_sel, out, *outputs)


def select_ord16(scores: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """The DCP pack's local top-k: scores ranked by their bf16 ord16 (ties to the lower index),
    ids ascending, -1 padded."""
    select(scores, lengths, scores.shape[1], 1, k, out, pinned=False, ord16=True)
