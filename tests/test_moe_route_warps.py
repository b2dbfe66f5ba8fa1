"""``moe_route``'s warp kernel (``ops/moe_route/warps.py``, one warp a token), bit for bit against
the reference on the same GPU, called directly at any batch (the op sends it batches of
``warps.MIN_TOKENS`` or more), on every kind of scores, every boundary of its limits
and a batch that leaves its last CTA's warps idle."""

from __future__ import annotations

import os

import pytest
import torch

import torch_sparse_decode as tsd
from inputs import KINDS, poisoned, scores
from torch_sparse_decode.ops.moe_route import reference, warps

# (experts, topk, groups, kept): DeepSeek-V3, groups of 64 and of 32 at 512, Kimi-K2, the widest,
# experts that leave lanes empty (60, 17, 1), topk 1 and the limit, one group kept and all kept.
CASES = [(256, 8, 8, 4), (512, 8, 8, 4), (512, 8, 16, 3), (256, 8, 8, 1), (64, 4, 2, 2), (384, 8, 1, 1),
         (512, 8, 1, 1), (256, 8, 1, 1), (160, 6, 1, 1), (60, 4, 1, 1), (17, 3, 1, 1), (8, 8, 1, 1), (1, 1, 1, 1)]
TOKENS = 4 * 9 + 3  # a last CTA of 3 tokens


def run_both(s, b, topk, *, renormalize=True, scale=1.0, apply_sigmoid=False, groups=1, kept=1,
             weights_dtype=torch.float32):
    """(warp kernel, reference) outputs on CUDA, each (weights, ids), from poisoned buffers."""
    s, b = s.cuda(), b.cuda()
    outs = []
    for route in (warps.route, reference.moe_route):
        weights = poisoned((s.shape[0], topk), weights_dtype, "cuda")
        ids = poisoned((s.shape[0], topk), torch.int32, "cuda")
        route(s, b, topk, renormalize, float(scale), apply_sigmoid, groups, kept, weights, ids)
        outs.append((weights.cpu(), ids.cpu()))
    return outs


def assert_same(s, b, topk, **kw):
    (weights, ids), (want_w, want_ids) = run_both(s, b, topk, **kw)
    assert torch.equal(ids, want_ids)
    assert torch.equal(weights.view(torch.int32 if weights.dtype == torch.float32 else torch.int16),
                       want_w.view(torch.int32 if want_w.dtype == torch.float32 else torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("experts,topk,groups,kept", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind(experts, topk, groups, kept, kind):
    s = scores(kind, (TOKENS, experts), seed=experts + topk)
    b = scores("few_distinct", (experts,), seed=3) * 0.01
    assert warps.fits(experts, groups, topk)
    assert_same(s, b, topk, groups=groups, kept=kept, scale=2.5)
    assert_same(s, torch.zeros(experts), topk, groups=groups, kept=kept, renormalize=False, apply_sigmoid=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (384, 8, 1, 1)])
def test_half_precision(dtype, experts, topk, groups, kept):
    s = torch.sigmoid(scores("random", (TOKENS, experts), seed=9)).to(dtype)
    s[1] = s[1, :1]
    s[2, :8] = float("nan")
    for bias in (torch.zeros(experts), torch.zeros(experts, dtype=dtype)):
        assert_same(s, bias, topk, groups=groups, kept=kept, scale=2.5)
        assert_same(s, bias, topk, groups=groups, kept=kept, weights_dtype=dtype, apply_sigmoid=True)


@pytest.mark.gpu
def test_bias_and_weight_edges():
    """NaN, +-inf and -0.0 in the bias; +inf scores (they share the weight); scores that overflow
    the fp32 sum (the rescaled sum); all-NaN and all-equal rows."""
    s = torch.sigmoid(scores("random", (TOKENS, 256), seed=4))
    s[0, :3] = float("inf")
    s[1, :8] = 3e38
    s[2] = float("nan")
    s[3] = 0.5
    b = torch.zeros(256)
    b[::5] = -0.0
    b[7], b[200], b[201] = float("nan"), float("inf"), float("-inf")
    for groups, kept in ((1, 1), (8, 4), (8, 1)):
        assert_same(s, b, 8, groups=groups, kept=kept)
        assert_same(s, torch.zeros(256), 8, groups=groups, kept=kept)


@pytest.mark.gpu
@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (384, 8, 1, 1)])
def test_the_op_takes_it_from_its_threshold(monkeypatch, experts, topk, groups, kept):
    """Through ``tsd.moe_route``: the CTA kernel's ids and weights, token for token, on either
    side of the threshold (one kernel below it, the other from it on)."""
    least = warps.MIN_TOKENS
    for tokens in (1, least - 1, least, 4096 + 1):
        s = torch.sigmoid(scores("random", (tokens, experts), seed=10)).cuda()
        s[::7] = 0.5
        b = (scores("few_distinct", (experts,), seed=11) * 0.01).cuda()
        kw = dict(num_expert_group=groups, topk_group=kept, scale=2.5)
        monkeypatch.setattr(warps, "ON", False)
        cta = tsd.moe_route(s, b, topk, **kw)
        monkeypatch.setattr(warps, "ON", True)
        assert warps.takes(s, groups, topk) == (tokens >= least)
        op = tsd.moe_route(s, b, topk, **kw)
        assert torch.equal(op[1], cta[1]) and torch.equal(op[0], cta[0])


def test_which_routings_take_it(monkeypatch):
    grouped = plain = warps.MIN_TOKENS
    x = torch.empty(plain, 384)
    monkeypatch.setattr(warps, "ON", False)
    assert not warps.takes(x, 1, 8)
    monkeypatch.setattr(warps, "ON", True)
    assert warps.takes(x, 1, 8) and not warps.takes(x[:-1], 1, 8)
    assert warps.takes(torch.empty(grouped, 256), 8, 8) and not warps.takes(torch.empty(grouped - 1, 256), 8, 8)
    assert warps.takes(torch.empty(plain, 60), 1, 4) and warps.takes(torch.empty(grouped, 512), 8, 8)
    assert not warps.takes(torch.empty(plain, 544), 1, 8)
    assert not warps.takes(x, 1, 9)  # more rounds than measured: the CTA kernel
    assert not warps.takes(torch.empty(plain, 256), 16, 8)  # groups of 16 experts straddle registers
    assert not warps.takes(torch.empty(plain, 160), 8, 6)
    assert warps.ON == (os.environ.get("TORCH_SPARSE_DECODE_ROUTE_WARPS", "1") == "1")  # on by default
