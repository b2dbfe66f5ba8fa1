import math

import pytest
import torch

from inputs import KINDS, scores
from oracle import python_ranked, ranked
from torch_sparse_decode import order

SPECIALS = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 3.4e38, -3.4e38]


def test_oracles_agree_with_python_sort():
    for kind in KINDS:
        row = scores(kind, (97,), seed=5)
        assert ranked(row).tolist() == python_ranked(row.tolist()), kind


@pytest.mark.parametrize("kind", KINDS)
def test_composite_key_ranks_like_the_oracle(kind):
    row = scores(kind, (300,), seed=1)
    keys = order.composite_key(order.canonical(row), torch.arange(300))
    assert torch.unique(keys).numel() == 300
    assert torch.argsort(keys, descending=True).tolist() == ranked(row).tolist()


def test_specials_order():
    row = torch.tensor(SPECIALS * 2)
    keys = order.composite_key(order.canonical(row), torch.arange(row.numel()))
    assert torch.argsort(keys, descending=True).tolist() == python_ranked(row.tolist())


def test_canonical_maps_nan_and_negative_zero():
    out = order.canonical(torch.tensor([math.nan, -0.0, 0.0, -1.0]))
    assert out[0].item() == -math.inf
    assert out[1].view(torch.int32).item() == 0  # +0.0 bits
    assert out[3].item() == -1.0


def test_ordered_bits_monotone_over_all_specials():
    values = sorted({v for v in SPECIALS if not math.isnan(v)} - {-0.0})
    bits = order.ordered_bits(torch.tensor(values)).tolist()
    assert bits == sorted(bits) and len(set(bits)) == len(bits)


def test_bf16_ord16_matches_seed_definition():
    # ord16(s) = s | 0x8000 for a clear sign bit, ~s & 0xFFFF otherwise (on the bf16 bits).
    values = torch.tensor([1.0, -1.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 1.00390625, -1e-45])
    got = order.bf16_ord16(values).tolist()
    bf = [0x3F80, 0xBF80, 0x0000, 0x0000, 0x7F80, 0xFF80, 0xFF80, 0x3F80, 0x0000]
    # 1.00390625 = 1 + 2**-8 rounds to even (1.0); -1e-45 rounds to -0.0, which ties +0.0.
    want = [b | 0x8000 if b < 0x8000 else (~b) & 0xFFFF for b in bf]
    assert got == want


def test_topk_by_key_and_ascending_ids():
    keys = torch.tensor([[5, 3, order.KEY_NONE, 9], [1, 2, 3, 4]])
    best, index = order.topk_by_key(keys, 3)
    assert index.tolist() == [[3, 0, 1], [3, 2, 1]]
    out = order.ascending_ids(index, best != order.KEY_NONE, 5)
    assert out.tolist() == [[0, 1, 3, -1, -1], [1, 2, 3, -1, -1]]
    assert out.dtype == torch.int32
