"""The Triton block-key kernel of the top-k engine on CPU tensors under TRITON_INTERPRET=1 (CI has
no GPU): its keys order blocks exactly as the reference's block scores do, at every edge."""

import os

import pytest
import torch

from inputs import KINDS, scores
from torch_sparse_decode.ops.select_candidate_blocks import reference
from torch_sparse_decode.order import canonical

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="interpreter run for CPU-only machines; GPU tests cover the compiled kernels",
)
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")
pytest.importorskip("triton", reason="triton not installed")
from torch_sparse_decode.ops.select_candidate_blocks import kernel as blocks  # noqa: E402


def unsigned_key(x: torch.Tensor) -> torch.Tensor:
    """The engine's key of fp32 scores (as int64 holding the unsigned 32-bit value)."""
    bits = canonical(x).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 1 << 31, bits ^ 0xFFFFFFFF, bits | (1 << 31))


# (block_size, keep_all, dtype): every block size class and keep_all in fp32; the narrow dtypes at
# three block sizes (CI time).
CONFIGS = [(bs, keep, torch.float32) for bs in (1, 3, 8, 64, 256) for keep in (0, 36)] + [
    (bs, 0, dtype) for dtype in (torch.bfloat16, torch.float16) for bs in (1, 8, 64)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_size,keep_all,dtype", CONFIGS)
def test_block_keys_match_reference_scores(kind, block_size, keep_all, dtype):
    """Rows of <= keep_all blocks are the engine's to keep unread; every other row is checked.
    bf16 / fp16 logits widen exactly, so their keys are those of their fp32 values."""
    if dtype == torch.bfloat16 and kind == "tiny_negative":
        pytest.skip("the interpreter widens bf16 subnormals wrongly (-3.03e-39 -> -3.67e-40); the GPU's cvt is "
                    "exact, and test_select_candidate_blocks checks bf16 subnormals there")
    bs = block_size
    width = 37 * bs + 5
    ends = torch.tensor([width, 0, 1, bs - 1, bs, bs + 1, 36 * bs, 36 * bs + 1, width + 9, -4], dtype=torch.int32)
    x = scores(kind, (ends.numel(), width), seed=block_size).to(dtype)
    keys = blocks.block_keys(x, ends, block_size, keep_all).to(torch.int64) & 0xFFFFFFFF
    want = unsigned_key(reference.block_scores(x, ends, block_size))
    valid = (ends.clamp(0, width).to(torch.int64) + bs - 1) // bs
    checked = 0
    for row in range(x.shape[0]):
        n = int(valid[row])
        if n > keep_all:
            assert torch.equal(keys[row, :n], want[row, :n]), (row, n)
            checked += 1
    assert checked >= (3 if keep_all else 7)


def test_keys_order_like_scores():
    values = torch.tensor([float("-inf"), -3.0, -1e-45, -0.0, 0.0, 1e-45, 2.0, float("inf"), float("nan")])
    keys = unsigned_key(values)
    assert keys[3] == keys[4] and keys[8] == keys[0]  # -0.0 ties +0.0, NaN is -inf
    assert torch.all(keys[1:8].diff() >= 0) and keys[0] < keys[1] and keys[0] > 0


@pytest.mark.parametrize("block_size", [1, 8, 64])
def test_block_keys_of_windows(block_size):
    """With starts, each row's keys are those of its window [start, end) moved to column 0."""
    from torch_sparse_decode.order import windows

    bs = block_size
    width = 37 * bs + 5
    starts = torch.tensor([0, 1, 3, bs + 1, width - 1, width, 60 * bs, -4], dtype=torch.int32)
    ends = torch.tensor([width, width, 3 + 5 * bs, width - 2, width, width, 10, 9], dtype=torch.int32)
    x = scores("random", (starts.numel(), width), seed=bs)
    shifted, n = windows(x, starts, ends)
    got = blocks.block_keys(x, ends, bs, 0, starts)
    want = blocks.block_keys(shifted.contiguous(), n.to(torch.int32), bs)
    valid = (n + bs - 1) // bs
    for row in range(x.shape[0]):
        assert torch.equal(got[row, :valid[row]], want[row, :valid[row]]), row
