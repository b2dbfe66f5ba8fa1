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
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "relu_zeros", "all_equal", "tiny_negative"])
def test_bf16_scores(device, kind):
    lengths = boundary_lengths(32, 1000)
    x = scores(kind, (lengths.numel(), 1000), seed=2).to(torch.bfloat16)
    check(x, lengths, 32, device)


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
