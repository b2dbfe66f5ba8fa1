import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores


def run(x, lengths, k, device):
    out = poisoned((x.shape[0], k), torch.int32, device)
    tsd.indexer_topk(x.to(device), lengths.to(device), k, out=out)
    return out.cpu()


def check(x, lengths, k, device):
    got = run(x, lengths, k, device)
    assert torch.equal(got, oracle.topk_tokens(x.float(), lengths, k))


def boundary_lengths(k: int, width: int) -> torch.Tensor:
    values = [0, 1, k - 1, k, k + 1, width - 1, width, width + 5, -3, width // 2]
    return torch.tensor([min(v, width + 5) for v in values], dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 7, 64])
def test_every_kind_and_boundary_length(device, kind, k):
    width = 300
    lengths = boundary_lengths(k, width)
    x = scores(kind, (lengths.numel(), width), seed=k)
    check(x, lengths, k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "relu_zeros", "all_equal", "tiny_negative", "nan_mixed",
                                  "inf_mixed"])
def test_half_precision_scores(device, dtype, kind):
    lengths = boundary_lengths(32, 1000)
    x = scores(kind, (lengths.numel(), 1000), seed=2).to(dtype)
    check(x, lengths, 32, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_ties_and_specials(device, dtype):
    """Ties that only the narrow type makes (fp32 scores a few ulps apart round to one value),
    its subnormals, its largest finite value and its overflow to inf, and -0.0 beside +0.0: all
    rank as their exact fp32 values, ties to the lower position."""
    gen = torch.Generator().manual_seed(11)
    x = (1 + torch.randn(6, 5000, generator=gen) * 1e-4).to(dtype)  # a few hundred distinct values
    info = torch.finfo(dtype)
    x[1, ::7] = info.max
    x[1, 3::11] = float("inf")
    x[1, 5::13] = 1e6  # fp16: inf; bf16: finite
    x[2] = torch.where(torch.arange(5000) % 2 == 0, -0.0, 0.0).to(dtype)
    x[2, 100:120] = info.smallest_normal / 4  # subnormals above the zeros
    x[3] = -info.smallest_normal / 8  # all equal, negative subnormal
    x[4, ::3] = float("nan")
    x[5] = torch.arange(5000).flip(0).to(dtype)  # descending, ties past 2**11 (fp16) / 2**8 (bf16)
    lengths = torch.tensor([5000, 4999, 3000, 2048, 4097, 5000], dtype=torch.int32)
    for k in (1, 31, 2048):
        check(x, lengths, k, device)


def window_edges(k: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends): windows of 0, 1, k - 1, k, k + 1 and most of the width, starting at 0, at
    odd (unaligned) columns and near the end; starts past the end, at it, and negative."""
    pairs = [(0, width), (1, width), (3, 3 + k - 1), (5, 5 + k), (7, 7 + k + 1), (width // 2 + 1, width),
             (width - 1, width), (width, width), (40, 20), (-9, 30), (13, width + 50), (0, 0), (2, 2 + k + 700)]
    starts, ends = zip(*[(s, min(e, width + 50)) for s, e in pairs])
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed", "ascending"])
@pytest.mark.parametrize("k,width", [(1, 300), (64, 300), (2048, 40000), (4096, 300000)])
def test_row_starts(device, kind, k, width):
    """Row i selects over [row_starts[i], lengths[i]); ids count from the start. Columns outside
    the window would win if read."""
    starts, ends = window_edges(k, width)
    x = scores(kind if kind != "ascending" else "random", (starts.numel(), width), seed=k)
    if kind == "ascending":
        x = torch.arange(width, dtype=torch.float32).expand(starts.numel(), width).clone()
    col = torch.arange(width)
    outside = (col < starts[:, None]) | (col >= ends[:, None])
    x = torch.where(outside, float("inf"), x)
    out = poisoned((starts.numel(), k), torch.int32, device)
    tsd.indexer_topk(x.to(device), ends.to(device), k, row_starts=starts.to(device), out=out)
    assert torch.equal(out.cpu(), oracle.windowed(oracle.topk_tokens, x, starts, ends, k))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_starts_half_precision(device, dtype):
    starts, ends = window_edges(256, 9000)
    x = scores("bf16_plateau", (starts.numel(), 9000), seed=3).to(dtype)
    out = tsd.indexer_topk(x.to(device), ends.to(device), 256, row_starts=starts.to(device)).cpu()
    assert torch.equal(out, oracle.windowed(oracle.topk_tokens, x.float(), starts, ends, 256))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [512, 1024, 2048, 4096])
def test_decode_sizes(device, k):
    lengths = torch.tensor([k - 1, k, k + 1, 5000, 9000, 0], dtype=torch.int32)
    x = scores("few_distinct", (6, 9000), seed=k)
    check(x, lengths, k, device)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows(device):
    base = scores("random", (4, 700), seed=9)
    x = base[:, :500]  # row stride 700, unit inner stride
    check(x, torch.tensor([500, 3, 250, 499], dtype=torch.int32), 100, device)


@pytest.mark.parametrize("device", DEVICES)
def test_largest_rows(device):
    width = 1 << 20
    x = scores("relu_zeros", (2, width), seed=1)
    check(x, torch.tensor([width, width - 4097], dtype=torch.int32), 4096, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [0, 1])
def test_tiny_width(device, width):
    x = scores("random", (2, width), seed=width)
    check(x, torch.tensor([width, 7], dtype=torch.int32), 3, device)
