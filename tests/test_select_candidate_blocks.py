import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores


def run(x, lengths, block_size, k, device):
    out = poisoned((x.shape[0], k), torch.int32, device)
    tsd.select_candidate_blocks(x.to(device), lengths.to(device), block_size, k, out=out)
    return out.cpu()


def check(x, lengths, block_size, k, device):
    got = run(x, lengths, block_size, k, device)
    want = oracle.candidate_blocks(x, lengths, block_size, k)
    assert torch.equal(got, want)
    return got


def edge_ends(block_size: int, k: int, width: int) -> torch.Tensor:
    bs = block_size
    ends = [0, 1, bs - 1, bs, bs + 1, (k - 1) * bs, k * bs - 1, k * bs, k * bs + 1, (k + 1) * bs, width, width + 9, -1]
    return torch.tensor([max(-1, min(e, width + 9)) for e in ends], dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_size", [1, 3, 8, 64])
def test_every_kind_and_block_edge(device, kind, block_size):
    k = 6
    width = (k + 3) * block_size + block_size // 2 + 1  # a partial last block
    ends = edge_ends(block_size, k, width)
    x = scores(kind, (ends.numel(), width), seed=block_size)
    check(x, ends, block_size, k, device)


@pytest.mark.parametrize("device", DEVICES)
def test_newest_block_is_pinned_even_when_worst(device):
    x = torch.zeros(3, 64)
    x[:, 48:] = -1e30  # blocks 6 and 7 (bs 8) score worst
    x[2, 60:] = float("nan")  # partially NaN newest block
    ends = torch.tensor([64, 60, 64], dtype=torch.int32)
    got = check(x, ends, 8, 3, device)
    assert got.tolist() == [[0, 1, 7], [0, 1, 7], [0, 1, 7]]


@pytest.mark.parametrize("device", DEVICES)
def test_nan_only_block_scores_minus_inf(device):
    x = torch.full((1, 32), float("nan"))
    x[0, 8:16] = -5.0
    got = check(x, torch.tensor([32], dtype=torch.int32), 8, 2, device)
    assert got.tolist() == [[1, 3]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size,k", [(64, 2048), (8, 2048), (256, 512), (1, 1024)])
def test_decode_sizes(device, block_size, k):
    width = (k + 40) * block_size
    ends = torch.tensor([width, k * block_size, (k + 1) * block_size - 1, 100 * block_size + 1], dtype=torch.int32)
    x = scores("bf16_plateau", (4, width), seed=block_size)
    check(x, ends, block_size, k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "nan_mixed", "inf_mixed", "tiny_negative"])
@pytest.mark.parametrize("block_size", [1, 8, 64])
def test_half_precision_logits(device, dtype, kind, block_size):
    """bf16 / fp16 logits: each block's max of the exact fp32 values, so blocks that tie in the
    narrow type stay tied (the lower block id first)."""
    k = 6
    width = (k + 3) * block_size + block_size // 2 + 1
    ends = edge_ends(block_size, k, width)
    check(scores(kind, (ends.numel(), width), seed=block_size).to(dtype), ends, block_size, k, device)
    x = (1 + torch.randn(3, 64 * block_size, generator=torch.Generator().manual_seed(5)) * 1e-4).to(dtype)
    x[1, ::3] = float("nan")
    x[2] = -0.0
    check(x, torch.tensor([64 * block_size, 50 * block_size - 1, 64 * block_size], dtype=torch.int32), block_size,
          17, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed"])
@pytest.mark.parametrize("block_size,k,width", [(1, 64, 3000), (8, 6, 200), (8, 2048, 40000), (64, 256, 300000)])
def test_row_starts(device, kind, block_size, k, width):
    """Row i's window is columns [row_starts[i], lengths[i]); its blocks count from the start
    (the newest: the window's last, partial or not). Columns outside would win if read."""
    bs = block_size
    pairs = [(0, width), (1, width), (3, 3 + k * bs), (5, 5 + (k - 1) * bs + 1), (7, 7 + (k + 1) * bs - 1),
             (width // 2 + 3, width), (width - 1, width), (width, width), (50, 10), (-5, 40), (9, width + 20)]
    starts = torch.tensor([p[0] for p in pairs], dtype=torch.int32)
    ends = torch.tensor([min(p[1], width + 20) for p in pairs], dtype=torch.int32)
    x = scores(kind, (len(pairs), width), seed=bs)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)
    out = poisoned((len(pairs), k), torch.int32, device)
    tsd.select_candidate_blocks(x.to(device), ends.to(device), bs, k, row_starts=starts.to(device), out=out)
    assert torch.equal(out.cpu(), oracle.windowed(oracle.candidate_blocks, x, starts, ends, bs, k))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [8, 64])
def test_largest_rows(device, block_size):
    width = 1 << 20
    x = scores("relu_zeros", (2, width), seed=block_size)
    check(x, torch.tensor([width, width - 5 * block_size - 3], dtype=torch.int32), block_size, 4096, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [0, 1])
def test_tiny_width(device, width):
    x = scores("random", (2, width), seed=width)
    check(x, torch.tensor([width, 7], dtype=torch.int32), 4, 3, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_k1_is_the_newest_block_alone(device, block_size):
    ends = torch.tensor([0, 1, block_size, block_size + 1, 5000, 20000, -1], dtype=torch.int32)
    x = scores("random", (ends.numel(), 20000), seed=block_size)
    got = check(x, ends, block_size, 1, device)
    assert got[:, 0].tolist() == [-1, 0, 0, 1, -(-5000 // block_size) - 1, -(-20000 // block_size) - 1, -1]
