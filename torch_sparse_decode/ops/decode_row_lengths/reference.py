"""The exact pure-torch reference of ``decode_row_lengths``: its CPU kernel and the tests' subject."""

from __future__ import annotations

import torch


def decode_row_lengths(seq_lens: torch.Tensor, next_n: int, out: torch.Tensor) -> None:
    """``out[b * next_n + j] = max(seq_lens[b] - next_n + j + 1, 0)``: the valid length of each
    of a request's ``next_n`` query rows (MTP / speculative decode), row j seeing the tokens up to
    and including its own."""
    step = torch.arange(1 - next_n, 1, dtype=torch.int64, device=seq_lens.device)
    out.copy_((seq_lens.to(torch.int64)[:, None] + step).clamp_(min=0).reshape(-1))
