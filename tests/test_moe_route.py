import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores

SHAPES = [(896, 16), (384, 8), (256, 8), (1024, 16), (160, 6), (8, 8), (1, 1), (17, 16)]


def route(s, b, topk, device, **kw):
    weights = poisoned((s.shape[0], topk), torch.float32, device)
    ids = poisoned((s.shape[0], topk), torch.int32, device)
    tsd.moe_route(s.to(device), b.to(device), topk, out=(weights, ids), **kw)
    return weights.cpu(), ids.cpu()


def check(s, b, topk, device, **kw):
    weights, ids = route(s, b, topk, device, **kw)
    if kw.get("apply_sigmoid") and device != "cpu":
        # The contract: moe_route(x, apply_sigmoid=True) == moe_route(torch.sigmoid(x)) on the same
        # device (CPU and CUDA sigmoids may differ by an ulp, which can reorder near-ties).
        s, kw = torch.sigmoid(s.to(device)).cpu(), {**kw, "apply_sigmoid": False}
    want_w, want_ids, condition = oracle.moe_route(s, b, topk, **kw)
    assert torch.equal(ids, want_ids)
    # Distinct valid experts, always.
    assert ids.min() >= 0 and ids.max() < s.shape[1]
    assert (torch.sort(ids, dim=1).values.diff(dim=1) > 0).all()
    oracle.assert_weights_close(weights, want_w, condition, topk)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_scores_of_every_kind(device, experts, topk, kind):
    s = scores(kind, (9, experts), seed=experts + topk)
    if kind in ("random", "bf16_plateau"):
        s = torch.sigmoid(s)
    b = torch.randn(experts, generator=torch.Generator().manual_seed(7)) * 0.05
    check(s, b, topk, device)
    check(s, torch.zeros(experts), topk, device, renormalize=False, scale=2.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("apply_sigmoid", [False, True])
@pytest.mark.parametrize("renormalize", [False, True])
def test_flags(device, apply_sigmoid, renormalize):
    s = scores("random", (33, 896), seed=3)
    b = scores("random", (896,), seed=4) * 0.1
    check(s, b, 16, device, apply_sigmoid=apply_sigmoid, renormalize=renormalize, scale=2.827)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_nan_inf_and_signed_zero(device):
    s = torch.full((4, 256), 0.25)
    s[1, 10:20] = 0.0
    bias = torch.zeros(256)
    bias[::3] = -0.0
    bias[5] = float("nan")  # expert 5 ranks last, weight 0 if chosen
    bias[200] = float("inf")  # expert 200 first everywhere
    bias[201] = float("-inf")
    w, ids = route(s, bias, 8, device)
    assert (ids[:, 0] == 200).all()
    assert (ids[:, 1:] == torch.tensor([0, 1, 2, 3, 4, 6, 7])).all()
    check(s, bias, 8, device)


@pytest.mark.parametrize("device", DEVICES)
def test_all_nan_rows_route_to_lowest_ids_with_zero_weight(device):
    s = torch.full((3, 896), float("nan"))
    w, ids = route(s, torch.zeros(896), 16, device)
    assert (ids == torch.arange(16, dtype=torch.int32)).all()
    assert (w == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_exactly_topk_finite_entries(device):
    s = torch.full((2, 384), float("nan"))
    finite = torch.tensor([3, 50, 99, 100, 200, 250, 300, 383])
    s[:, finite] = torch.rand(2, 8)
    w, ids = route(s, torch.zeros(384), 8, device)
    assert torch.equal(torch.sort(ids, dim=1).values, finite.to(torch.int32).expand(2, 8))
    check(s, torch.zeros(384), 8, device)


@pytest.mark.parametrize("device", DEVICES)
def test_largest_batch(device):
    s = torch.sigmoid(scores("random", (8192, 896), seed=11))
    s[::7] = 0.5  # CUDA-graph padding rows: all equal
    b = scores("few_distinct", (896,), seed=12) * 0.01
    check(s, b, 16, device)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    w, ids = route(torch.empty(0, 896), torch.zeros(896), 16, device)
    assert w.shape == (0, 16) and ids.shape == (0, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk", [(896, 16), (1024, 16), (384, 8)])
def test_crowded_candidates(device, experts, topk):
    """The top keys concentrated in half of the expert groups (e % 32): a long candidate list."""
    gen = torch.Generator().manual_seed(experts)
    s = torch.rand(6, experts, generator=gen) * 0.1
    hot = (torch.arange(experts) % 32) < 16
    s[:, hot] = 0.9 + torch.rand(6, int(hot.sum()), generator=gen) * 0.1
    s[1, hot] = 0.95  # and tied
    s[2] = torch.where(hot, 0.95, float("nan"))
    check(s, torch.zeros(experts), topk, device)


@pytest.mark.gpu
def test_sigmoid_is_torch_cuda_sigmoid_bit_for_bit():
    x = torch.randn(64, 896, device="cuda") * 8
    x[0, :100] = torch.linspace(-90, 90, 100)
    weights, ids = tsd.moe_route(x, torch.zeros(896, device="cuda"), 16, renormalize=False, apply_sigmoid=True)
    assert torch.equal(weights, torch.sigmoid(x).gather(1, ids.long()))


@pytest.mark.parametrize("device", DEVICES)
def test_renormalize_never_overflows_and_inf_shares(device):
    """A finite sum that overflows fp32 ([3e38, 3e38] is 6e38) still divides; +inf scores share the
    weight evenly (inf / inf would be NaN) and the others get 0; -inf or a sum <= 0 divides by 1."""
    inf = float("inf")
    s = torch.zeros(6, 64)
    s[0, :2] = 3e38
    s[1, :16] = 3.4e38
    s[2, [5, 9]] = inf
    s[2, 3] = 1.0
    s[3, :4] = torch.tensor([3e38, 3e38, -3e38, 1.0])
    s[4, 7] = inf
    s[:5, 40:] = -1.0  # never among the best
    s[5] = -inf
    s[5, :2] = torch.tensor([0.5, 0.25])  # and two -inf selected: the sum is -inf, divides by 1
    weights, ids = route(s, torch.zeros(64), 4, device, scale=2.0)
    assert torch.equal(weights[0], torch.tensor([1.0, 1.0, 0.0, 0.0]))  # 0.5 each, times 2
    assert torch.equal(weights[1], torch.full((4,), 0.5))  # four of the sixteen selected: 1/4 each
    assert ids[2, :2].tolist() == [5, 9] and torch.equal(weights[2], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert ids[3].tolist() == [0, 1, 3, 4]  # -3e38 is not among the best 4
    assert torch.allclose(weights[4], torch.tensor([2.0, 0.0, 0.0, 0.0]))
    assert torch.equal(weights[5], torch.tensor([1.0, 0.5, -inf, -inf]))
    assert not torch.isnan(weights).any()
    check(s, torch.zeros(64), 4, device, scale=2.0)
    check(s, torch.zeros(64), 3, device)
