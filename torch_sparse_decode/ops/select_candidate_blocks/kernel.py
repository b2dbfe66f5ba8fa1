"""The CUDA kernel of ``select_candidate_blocks``: a Triton pre-pass reduces each valid block to
one engine key (the block's max over its valid columns), then the top-k engine selects the best
``k - 1`` of them beside the pinned newest block.

Why Triton for the block keys: a masked 2-D max over any block size is a few lines there, and it
runs on the CPU interpreter in CI. The engine then reads ``ceil(width / block_size)`` keys per row
instead of the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dtypes import WARM_SCORES
from ...kernels import pdl, topk as engine


@triton.jit
def _block_keys(logits, stride, ends, starts, width, keys, keys_stride, keep_all, WINDOWED: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_P2: tl.constexpr, BLOCKS: tl.constexpr, EARLY: tl.constexpr = False,
                PDL: tl.constexpr = False):
    """keys[row, b]: the engine's key of block b's max over its valid columns (NaN ignored), then 0
    (no key) up to the next multiple of 4 blocks, so the engine's 16-byte copies read only
    written words. Blocks count from the row's window start (``starts[row]`` where ``WINDOWED``,
    else 0: a constant, so Triton sees the row's 16-byte alignment and gives each thread 16 bytes
    of a block; a runtime start costs twice the instructions). EARLY: the engine (a programmatic
    dependent, waiting for this grid) may launch now. PDL: this pass is itself a programmatic
    dependent of the kernel that writes the logits, and waits for it."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    first = tl.program_id(1) * BLOCKS
    end = tl.minimum(tl.maximum(tl.load(ends + row), 0), width)
    start = 0
    if WINDOWED:
        start = tl.minimum(tl.maximum(tl.load(starts + row), 0), end)
    n_cols = end - start
    n_blocks = tl.cdiv(n_cols, BLOCK)
    if (first < n_blocks) & (n_blocks > keep_all):  # the engine keeps rows of <= keep_all blocks unread
        b = first + tl.arange(0, BLOCKS)
        lane = tl.arange(0, BLOCK_P2)[None, :]
        cols = b[:, None] * BLOCK + lane
        inside = (b[:, None] < n_blocks) & (cols < n_cols) & (lane < BLOCK)
        x = tl.load(logits + row.to(tl.int64) * stride + start + cols, mask=inside, other=float("-inf"))
        x = x.to(tl.float32)  # bf16 / fp16 widen exactly
        x = tl.max(tl.where(x != x, float("-inf"), x), axis=1)
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 ties +0.0
        key = bits ^ tl.where(bits < 0, -1, -2147483648)  # unsigned order = score order
        key = tl.where(b < n_blocks, key, 0)
        tl.store(keys + row.to(tl.int64) * keys_stride + b, key, mask=b < (n_blocks + 3) // 4 * 4)


def block_keys(logits: torch.Tensor, lengths: torch.Tensor, block_size: int, keep_all: int = 0,
               starts: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [rows, ceil(width / block_size)] holding unsigned keys of the blocks of each row's
    window [starts, lengths) (from column 0 without ``starts``); only valid blocks written (and
    zeros up to the next 16 bytes), and none of a row of <= ``keep_all`` valid blocks (the engine
    keeps those without reading a key). Rows start 16-byte aligned (the row stride is padded to 4
    keys), so no copy of the engine reaches before a row's first key.

    From the caching allocator: graph-capture safe (the graph's pool owns it). Not a caller-owned
    op argument: a mutable optional argument with a default breaks torch 2.11's custom_op
    (its ADInplaceOrView kernel indexes the arguments before filling defaults)."""
    rows, width = logits.shape
    num_blocks = -(-width // block_size)
    keys = torch.empty(rows, -(-num_blocks // 4) * 4, dtype=torch.int32, device=logits.device)[:, :num_blocks]
    block_p2 = max(triton.next_power_of_2(block_size), 1)
    per_program = max(8192 // block_p2, 1)
    if rows and num_blocks:
        dependent = pdl.enabled(pdl.TOPK)
        # EARLY off only in the CPU interpreter (no PDL there); not `logits.is_cuda`, so that the
        # launch build_kernels compiles from CPU tensors is the one a GPU makes.
        _block_keys[(rows, triton.cdiv(num_blocks, per_program))](
            logits, logits.stride(0), lengths, lengths if starts is None else starts, width, keys, keys.stride(0),
            keep_all, WINDOWED=starts is not None, BLOCK=block_size, BLOCK_P2=block_p2, BLOCKS=per_program,
            EARLY=not pdl.INTERPRETED, PDL=dependent, num_warps=8, launch_pdl=dependent,
        )
    return keys


def select_candidate_blocks(logits: torch.Tensor, lengths: torch.Tensor, block_size: int, k: int,
                            out: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    """The CUDA kernel of ``sparse_decode::select_candidate_blocks`` (arguments already checked)."""
    # The engine reads no key of a row of <= k blocks, nor of any row when k = 1 (the pinned one alone).
    keys = block_keys(logits, lengths, block_size, keep_all=k if k > 1 else 1 << engine.ID_BITS, starts=row_starts)
    engine.select(keys, lengths, logits.shape[1], block_size, k - 1, out, pinned=True, starts=row_starts)


def warm_triton(device: torch.device) -> None:
    """Compile the decode shapes' block-key kernels (the engine is in its catalog): the served
    score dtypes, block sizes 8 and 64, with and without windows (``kernels/triton_cache``)."""
    n = torch.full((1,), 1 << 15, dtype=torch.int32, device=device)
    for dtype in WARM_SCORES:
        x = torch.zeros(1, 1 << 15, device=device, dtype=dtype)
        for block in (8, 64):
            block_keys(x, n, block)
            block_keys(x, n, block, starts=n)
