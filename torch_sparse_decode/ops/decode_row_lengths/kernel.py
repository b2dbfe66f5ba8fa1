"""The CUDA kernel of ``decode_row_lengths``: one Triton launch, a program per 1024 rows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 1024  # per program


@triton.jit
def _row_lengths(seq_lens, out, rows, next_n, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    inside = r < rows
    seq_len = tl.load(seq_lens + r // next_n, mask=inside, other=0).to(tl.int64)
    length = tl.maximum(seq_len - next_n + r % next_n + 1, 0)  # int64: no overflow at any seq_len
    tl.store(out + r, length.to(tl.int32), mask=inside)


def decode_row_lengths(seq_lens: torch.Tensor, next_n: int, out: torch.Tensor) -> None:
    """The CUDA kernel of ``sparse_decode::decode_row_lengths`` (arguments already checked)."""
    rows = out.shape[0]
    if rows:
        _row_lengths[(triton.cdiv(rows, ROWS),)](seq_lens, out, rows, next_n, ROWS=ROWS, num_warps=4)


def warm_triton(device: torch.device) -> None:
    seq_lens = torch.ones(1, dtype=torch.int32, device=device)
    decode_row_lengths(seq_lens, 2, torch.empty(2, dtype=torch.int32, device=device))
