"""indexer_topk_fused: the KV slots through a page table, the raw positions and the values,
against the positions of the oracle mapped by hand, on every path of the engine (rows of <= k
keys, two passes, one read, windows), every score dtype, ties and NaN."""

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, same_bits, scores
from torch_sparse_decode.dtypes import TOPK_SCORES


def page_table(rows: int, width: int, page_size: int, seed: int) -> torch.Tensor:
    pages = -(-width // page_size) + 1  # one spare page: tables may be wider than the row
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(rows * pages, generator=gen)[:pages] for _ in range(rows)]).to(torch.int32)


def by_hand(x, lengths, k, table, page_size, starts=None):
    """(slots, positions, values) from the oracle's positions."""
    rows, width = x.shape
    if starts is None:
        ids = oracle.topk_tokens(x.float(), lengths, k)
        starts = torch.zeros(rows, dtype=torch.int32)
    else:
        ids = oracle.windowed(oracle.topk_tokens, x.float(), starts, lengths, k)
    slots = torch.full_like(ids, -1)
    values = torch.full((rows, k), float("-inf"), dtype=x.dtype)
    for r in range(rows):
        first = min(max(int(starts[r]), 0), min(max(int(lengths[r]), 0), width))
        for j, p in enumerate(ids[r].tolist()):
            if p >= 0:
                slots[r, j] = int(table[r, p // page_size]) * page_size + p % page_size
                values[r, j] = x[r, first + p]
    return slots, ids, values


def run(x, lengths, k, table, page_size, device, starts=None):
    rows = x.shape[0]
    out, ids = poisoned((rows, k), torch.int32, device), poisoned((rows, k), torch.int32, device)
    values = poisoned((rows, k), x.dtype, device)
    torch.ops.sparse_decode.indexer_topk_fused(x.to(device), lengths.to(device), k, out, ids, values,
                                               table.to(device), page_size,
                                               None if starts is None else starts.to(device))
    return out.cpu(), ids.cpu(), values.cpu()


def check(x, lengths, k, page_size, device, starts=None, seed=0):
    table = page_table(x.shape[0], x.shape[1], page_size, seed)
    got = run(x, lengths, k, table, page_size, device, starts)
    want = by_hand(x, lengths, k, table, page_size, starts)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert same_bits(got[2], want[2]), (got[2], want[2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", TOPK_SCORES)
def test_slots_ids_and_values(device, kind, page_size, dtype):
    width, k = 3000, 100
    lengths = torch.tensor([0, 1, k - 1, k, k + 1, width, width - 7, 1500], dtype=torch.int32)
    check(scores(kind, (lengths.numel(), width), seed=page_size).to(dtype), lengths, k, page_size, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,width", [(2048, 40000), (2048, 300000), (4096, 1 << 20)])
def test_long_rows(device, k, width):
    """The two-pass and the one-read paths (and their copy-based output stage); a row of mostly
    +-0.0, whose selected zeros' values must keep their signs."""
    lengths = torch.tensor([width, width // 2 + 3, k + 5, width], dtype=torch.int32)
    x = scores("random", (4, width), seed=k)
    x[1] = torch.arange(width).flip(0).float()
    x[3] = scores("signed_zeros", (1, width), seed=k)[0]
    check(x, lengths, k, 64, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [300000, 1 << 19])
def test_tie_path_copy_at_capacity(device, width):
    """Zeros with k - 100 positives over one CTA's span (or half the row) at k = 4096, the copy's
    capacity: the tie path writes the positives from its copy of the keys above the tied bucket,
    staged in the same arrays; signed zeros keep their signs."""
    k, rows = 4096, 4
    gen = torch.Generator().manual_seed(width)
    x = torch.zeros(rows, width)
    for r, (lo, hi) in enumerate([(0, width // 8), (width - width // 8, width), (0, width // 2), (width // 2, width)]):
        at = lo + torch.randperm(hi - lo, generator=gen)[: k - 100]
        x[r, at] = torch.rand(at.numel(), generator=gen) + 0.5
    x[2] = torch.where(x[2] == 0, torch.where(torch.rand(width, generator=gen) < 0.5, -0.0, 0.0), x[2])
    check(x, torch.full((rows,), width, dtype=torch.int32), k, 64, device)


@pytest.mark.parametrize("device", DEVICES)
def test_windows(device):
    width, k = 20000, 512
    starts = torch.tensor([0, 1, 7, 10000, 19999, 20000, -3], dtype=torch.int32)
    ends = torch.tensor([20000, 20000, 7 + k, 20000, 20000, 20000, 600], dtype=torch.int32)
    check(scores("few_distinct", (7, width), seed=5), ends, k, 16, device, starts)


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_outputs(device):
    x = torch.randn(2, 500, generator=torch.Generator().manual_seed(2)).to(device)
    n = torch.tensor([500, 20], dtype=torch.int32, device=device)
    table = page_table(2, 500, 16, 3).to(device)
    plain = tsd.indexer_topk_fused(x, n, 32)
    assert torch.equal(plain.out, tsd.indexer_topk(x, n, 32)) and plain.ids is None and plain.values is None
    paged = tsd.indexer_topk_fused(x, n, 32, page_table=table, page_size=16, ids=True, values=True)
    assert torch.equal(paged.ids, plain.out)
    want = by_hand(x.cpu(), n.cpu(), 32, table.cpu(), 16)
    assert torch.equal(paged.out.cpu(), want[0]) and torch.equal(paged.values.cpu(), want[2])


def test_values_are_compared_bit_for_bit():
    """The value check tells -0.0 from +0.0 and one NaN from another (the engine decodes values
    from keys, which do not)."""
    nan = torch.tensor([float("nan")])
    other_nan = (nan.view(torch.int32) ^ 1).view(torch.float32)
    for dtype in TOPK_SCORES:
        assert not same_bits(torch.tensor([-0.0], dtype=dtype), torch.tensor([0.0], dtype=dtype))
    assert not same_bits(nan, other_nan) and same_bits(nan, nan.clone())
