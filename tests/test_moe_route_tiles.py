"""``moe_route``'s tile kernel (``ops/moe_route/tiles.py``, many tokens a program), bit for bit
against the reference: in the CPU interpreter (CI) and on the GPU, where it also serves the op
(``TORCH_SPARSE_DECODE_ROUTE_TILES=1``; forced here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores
from torch_sparse_decode.ops.moe_route import reference, tiles, warps

# (experts, topk, groups, groups kept): DeepSeek-V3, Kimi-K2 / K3, the largest, groups of one
# expert, odd sizes (padded to a power of two), the smallest.
CASES = [(256, 8, 8, 4), (256, 8, 1, 1), (384, 8, 1, 1), (896, 16, 1, 1), (1024, 32, 1, 1), (1024, 16, 32, 8),
         (32, 4, 32, 8), (64, 6, 4, 2), (160, 6, 1, 1), (17, 16, 1, 1), (1, 1, 1, 1)]
TOKENS = 37  # not a multiple of any tile's tokens


def sigmoid_as_interpreted(x: torch.Tensor) -> torch.Tensor:
    """The interpreter's sigmoid (numpy's float32 exp and division): what the reference is given
    on the CPU, where torch's sigmoid may differ from it by an ulp."""
    x = x.float().numpy()
    return torch.from_numpy(np.float32(1.0) / (np.float32(1.0) + np.exp(-x)))


def run_both(s, b, topk, device, *, renormalize=True, scale=1.0, apply_sigmoid=False, groups=1, kept=1,
             weights_dtype=torch.float32):
    """(tile kernel, reference) outputs, each (weights, ids), from poisoned buffers."""
    s, b = s.to(device), b.to(device)
    outs = []
    for route in (tiles.route_tiles, reference.moe_route):
        given, sigmoid = s, apply_sigmoid
        if route is reference.moe_route and apply_sigmoid and device == "cpu":
            given, sigmoid = sigmoid_as_interpreted(s).to(s.dtype if s.dtype == torch.float32 else torch.float32), False
        weights = poisoned((s.shape[0], topk), weights_dtype, device)
        ids = poisoned((s.shape[0], topk), torch.int32, device)
        route(given, b, topk, renormalize, float(scale), sigmoid, groups, kept, weights, ids)
        outs.append((weights.cpu(), ids.cpu()))
    return outs


def assert_same(s, b, topk, device, **kw):
    (weights, ids), (want_weights, want_ids) = run_both(s, b, topk, device, **kw)
    assert torch.equal(ids, want_ids)
    if weights.dtype == torch.bfloat16 and device == "cpu":
        # The interpreter narrows fp32 to bf16 by truncation (numpy has no bf16); the GPU's cvt
        # rounds to nearest even, as torch does, and is checked exactly there.
        assert (weights.view(torch.int16).int() - want_weights.view(torch.int16).int()).abs().max() <= 1
        return
    bits = torch.int32 if weights.dtype == torch.float32 else torch.int16
    assert torch.equal(weights.view(bits), want_weights.view(bits))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk,groups,kept", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_scores(device, experts, topk, groups, kept, kind):
    s = scores(kind, (TOKENS, experts), seed=experts + topk)
    if kind == "random":
        s = torch.sigmoid(s)
    b = scores("few_distinct", (experts,), seed=7) * 0.05
    assert_same(s, b, topk, device, groups=groups, kept=kept)
    assert_same(s, torch.zeros(experts), topk, device, groups=groups, kept=kept, renormalize=False, scale=2.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (384, 8, 1, 1), (896, 16, 1, 1)])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float16])
def test_logits_through_the_sigmoid_in_each_dtype(device, experts, topk, groups, kept, source):
    x = (scores("random", (TOKENS, experts), seed=3) * 4).to(source)
    x[0, : min(experts, 100)] = torch.linspace(-90, 90, min(experts, 100)).to(source)
    b = scores("random", (experts,), seed=4) * 0.1
    for renormalize in (False, True):
        assert_same(x, b, topk, device, apply_sigmoid=True, groups=groups, kept=kept, renormalize=renormalize,
                    scale=2.827)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_weights_and_bias(device):
    s = torch.sigmoid(scores("random", (TOKENS, 256), seed=5)).bfloat16()
    assert_same(s, (scores("random", (256,), seed=6) * 0.05).bfloat16(), 8, device, groups=8, kept=4,
                weights_dtype=torch.bfloat16, scale=2.5)


@pytest.mark.parametrize("device", DEVICES)
def test_renormalize_edges(device):
    """Sums that overflow fp32, +inf scores sharing the weight, rows that sum to 0 or below, NaN
    scores (weight 0), bias of NaN, +-inf and -0.0."""
    s = torch.rand(8, 256, generator=torch.Generator().manual_seed(8))
    s[0, :8] = 3e38
    s[1, :3] = float("inf")
    s[2] = 0.0
    s[3] = -0.0
    s[4, ::2] = float("nan")
    s[5] = float("nan")
    s[6] = -torch.rand(256, generator=torch.Generator().manual_seed(9))
    b = torch.zeros(256)
    b[::5] = -0.0
    b[7], b[200], b[201] = float("nan"), float("inf"), float("-inf")
    for groups, kept in ((1, 1), (8, 4)):
        assert_same(s, b, 8, device, groups=groups, kept=kept)
        assert_same(s, torch.zeros(256), 8, device, groups=groups, kept=kept)


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens(device):
    (weights, ids), _ = run_both(torch.empty(0, 256), torch.zeros(256), 8, device)
    assert weights.shape == ids.shape == (0, 8)


def test_which_routings_take_it(monkeypatch):
    x = torch.empty(tiles.MIN_TOKENS, 384)
    monkeypatch.setattr(tiles, "TILES", False)
    assert not tiles.takes(x, 1, 8)
    monkeypatch.setattr(tiles, "TILES", True)
    assert tiles.takes(x, 1, 8) and not tiles.takes(x[:-1], 1, 8) and tiles.fits(160, 1) and not tiles.fits(160, 5)
    assert tiles.takes(torch.empty(tiles.MIN_TOKENS, 256), 8, 8)
    assert not tiles.takes(x, 4, 8) and not tiles.takes(torch.empty(tiles.MIN_TOKENS, 256), 16 + 8, 8)
    # More rounds or experts than the warp's floor beats (module docstring): the CuTe kernel.
    assert not tiles.takes(x, 1, 9) and not tiles.takes(torch.empty(tiles.MIN_TOKENS, 896), 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (384, 8, 1, 1), (512, 8, 1, 1)])
def test_the_op_takes_it_at_many_tokens(monkeypatch, experts, topk, groups, kept):
    """Through ``tsd.moe_route`` on CUDA (the switch on): the same ids and weights as the CuTe
    kernel, token for token, at a prefill-sized batch with padding rows."""
    s = torch.sigmoid(scores("random", (4096, experts), seed=10)).cuda()
    s[::7] = 0.5
    b = (scores("few_distinct", (experts,), seed=11) * 0.01).cuda()
    kw = dict(num_expert_group=groups, topk_group=kept, scale=2.5)
    monkeypatch.setattr(warps, "ON", False)  # it comes first where switched on
    monkeypatch.setattr(tiles, "TILES", False)  # the CuTe kernel, whatever the environment says
    cute = tsd.moe_route(s, b, topk, **kw)
    monkeypatch.setattr(tiles, "TILES", True)
    assert tiles.takes(s, groups, topk)
    tiled = tsd.moe_route(s, b, topk, **kw)
    assert torch.equal(tiled[1], cute[1]) and torch.equal(tiled[0], cute[0])
