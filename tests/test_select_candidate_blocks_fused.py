"""select_candidate_blocks_fused: the selected block ids mapped through a block table (and the raw
ids beside them), against the oracle's blocks mapped by hand, on every path of the engine."""

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, poisoned, scores


def block_table(rows: int, width: int, block_size: int, seed: int) -> torch.Tensor:
    blocks = -(-width // block_size) + 3
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << 30, (rows, blocks), generator=gen, dtype=torch.int32)


def check(x, lengths, block_size, k, device, starts=None, seed=0):
    rows, width = x.shape
    table = block_table(rows, width, block_size, seed)
    out, ids = poisoned((rows, k), torch.int32, device), poisoned((rows, k), torch.int32, device)
    torch.ops.sparse_decode.select_candidate_blocks_fused(x.to(device), lengths.to(device), block_size, k, out, ids,
                                                          table.to(device),
                                                          None if starts is None else starts.to(device))
    if starts is None:
        want = oracle.candidate_blocks(x.float(), lengths, block_size, k)
    else:
        want = oracle.windowed(oracle.candidate_blocks, x.float(), starts, lengths, block_size, k)
    mapped = torch.where(want >= 0, torch.gather(table, 1, want.clamp(min=0).long()), -1)
    assert torch.equal(ids.cpu(), want) and torch.equal(out.cpu(), mapped)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed"])
@pytest.mark.parametrize("block_size,k", [(1, 64), (8, 1), (8, 6), (64, 2048)])
def test_block_ids_through_the_table(device, kind, block_size, k):
    width = max(3000, (k + 40) * block_size)
    lengths = torch.tensor([0, 1, block_size * k, block_size * k + 1, width, width - 3], dtype=torch.int32)
    check(scores(kind, (6, width), seed=block_size).to(torch.bfloat16 if kind == "random" else torch.float32),
          lengths, block_size, k, device)


@pytest.mark.parametrize("device", DEVICES)
def test_windows_and_long_rows(device):
    width = 1 << 20
    starts = torch.tensor([0, 5, width // 2], dtype=torch.int32)
    ends = torch.tensor([width, width - 9, width], dtype=torch.int32)
    check(scores("random", (3, width), seed=1), ends, 8, 2048, device, starts)


def test_wrapper():
    x, n = torch.randn(2, 100), torch.tensor([100, 5], dtype=torch.int32)
    table = block_table(2, 100, 8, 0)
    got = tsd.select_candidate_blocks_fused(x, n, 8, 4, table, ids=True)
    assert torch.equal(got.ids, tsd.select_candidate_blocks(x, n, 8, 4)) and got.values is None
