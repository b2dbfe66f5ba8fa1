import os
import sys

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores
from torch_sparse_decode.ops.moe_route import reference

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import bench_moe_route  # noqa: E402  (the benchmark's baseline: DeepSeek-V3's own routing code)

SHAPES = [(896, 16), (384, 8), (256, 8), (1024, 16), (160, 6), (8, 8), (1, 1), (17, 16)]


def route(s, b, topk, device, weights_dtype=torch.float32, **kw):
    weights = poisoned((s.shape[0], topk), weights_dtype, device)
    ids = poisoned((s.shape[0], topk), torch.int32, device)
    tsd.moe_route(s.to(device), b.to(device), topk, out=(weights, ids), **kw)
    return weights.cpu(), ids.cpu()


def check(s, b, topk, device, weights_dtype=torch.float32, **kw):
    weights, ids = route(s, b, topk, device, weights_dtype, **kw)
    if weights_dtype != torch.float32:  # the fp32 weights rounded once
        assert torch.equal(weights, route(s, b, topk, device, **kw)[0].to(weights_dtype))
    if device != "cpu":  # bit-identical to the reference on the same device, ids and weights
        want = poisoned((s.shape[0], topk), weights_dtype, device), poisoned((s.shape[0], topk), torch.int32, device)
        reference.moe_route(s.to(device), b.to(device), topk, kw.get("renormalize", True), float(kw.get("scale", 1.0)),
                            kw.get("apply_sigmoid", False), kw.get("num_expert_group", 1), kw.get("topk_group", 1),
                            *want)
        assert torch.equal(ids, want[1].cpu()) and torch.equal(weights, want[0].cpu())
    if kw.get("apply_sigmoid") and device != "cpu":
        # The contract: moe_route(x, apply_sigmoid=True) == moe_route(torch.sigmoid(x)) on the same
        # device (CPU and CUDA sigmoids may differ by an ulp, which can reorder near-ties).
        s, kw = torch.sigmoid(s.to(device).float()).cpu(), {**kw, "apply_sigmoid": False}
    want_w, want_ids, condition = oracle.moe_route(s, b, topk, **kw)
    assert torch.equal(ids, want_ids)
    if weights_dtype != torch.float32:
        return
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


# ------------------------------------------------------------------ grouped routing, dtypes, k <= 32

GROUPED = [(256, 8, 8, 4), (160, 6, 8, 3), (1024, 32, 32, 8), (64, 4, 32, 2), (96, 12, 12, 12), (8, 2, 8, 2),
           (512, 8, 16, 4), (64, 4, 2, 1), (96, 6, 3, 2)]


@pytest.fixture(params=[False, True], ids=["block", "group_warps"])
def group_warps(request, monkeypatch, device):
    """Both ways the CTA kernel keeps the best groups: by the block, and (groups of 32 experts,
    the default) in the warps that hold them (``kernel.GROUP_WARPS``)."""
    from torch_sparse_decode.ops.moe_route import kernel

    if request.param and device == "cpu":
        pytest.skip("a CUDA kernel's switch")
    monkeypatch.setattr(kernel, "GROUP_WARPS", request.param)
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk,groups,kept", GROUPED)
@pytest.mark.parametrize("kind", KINDS)
def test_grouped_routing_of_every_kind(group_warps, device, experts, topk, groups, kept, kind):
    s = scores(kind, (9, experts), seed=experts + groups)
    if kind in ("random", "bf16_plateau"):
        s = torch.sigmoid(s)
    b = torch.randn(experts, generator=torch.Generator().manual_seed(5)) * 0.05
    check(s, b, topk, device, num_expert_group=groups, topk_group=kept, scale=2.5)
    check(s, torch.zeros(experts), topk, device, num_expert_group=groups, topk_group=kept, renormalize=False)


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_routing_is_deepseek_v3s_on_distinct_keys(group_warps, device):
    """Random scores (no ties, no NaN): the same experts as DeepSeek-V3's own code, 256 experts in
    8 groups, 4 kept, top 8, scale 2.5."""
    gen = torch.Generator().manual_seed(21)
    s = torch.sigmoid(torch.randn(64, 256, generator=gen))
    b = torch.randn(256, generator=gen) * 0.1
    weights, ids = route(s, b, 8, device, num_expert_group=8, topk_group=4, scale=bench_moe_route.SCALE)
    want_w, want_ids = bench_moe_route.deepseek_v3_route(s, b, 8, 8, 4)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_no_expert_outside_the_kept_groups_even_when_every_kept_key_is_negative(group_warps, device):
    """Masking the other groups with 0.0 would pick them here; so would -inf where the kept keys
    are -inf or NaN (ties go to the lower id, and the other groups come first)."""
    s = torch.zeros(4, 64)
    b = torch.zeros(64)
    s[0, :32] = 0.9  # groups 0-3 (of 8) look strong on their two best keys...
    s[0, 32:] = -0.5  # ...and groups 4-7 negative
    s[1] = -1.0
    s[1, 40:42] = -0.1  # group 5 best
    s[2, :56] = 0.5
    s[2, 56:] = float("nan")  # group 7 all NaN: its score is -inf
    s[3] = float("-inf")
    s[3, 60:62] = 1.0  # group 7 holds the only finite keys (one alone would sum to -inf)
    _, ids = route(s, b, 8, device, num_expert_group=8, topk_group=1)
    assert (ids[0] < 8).all()  # group 0, the lowest of four equal groups
    assert ((ids[1] >= 40) & (ids[1] < 48)).all()
    assert (ids[2] < 8).all()
    assert ((ids[3] >= 56) & (ids[3] < 64)).all() and ids[3, 0] == 60
    for kept in (1, 2, 5):
        check(s, b, min(8, 8 * kept), device, num_expert_group=8, topk_group=kept)


@pytest.mark.parametrize("device", DEVICES)
def test_group_ties(group_warps, device):
    """Two groups whose two best keys sum alike (the lower group wins), a tie made of different
    pairs (0.5 + 0.25 against 0.375 + 0.375), ties inside a kept group, all-equal rows, -0.0 against
    +0.0, and a group of +inf and -inf (its sum is NaN: it ranks last)."""
    inf = float("inf")
    s = torch.full((6, 32), 0.125)
    s[0, 8:12] = torch.tensor([0.5, 0.25, 0.0, 0.0])
    s[0, 16:20] = torch.tensor([0.375, 0.375, 0.0, 0.0])
    s[1] = 0.25  # all equal
    s[2, :4] = -0.0
    s[2, 4:] = -1.0
    s[2, 28:] = 0.0
    s[3, :4] = torch.tensor([inf, -inf, -inf, -inf])
    s[3, 4:] = -1.0
    s[4, ::2] = 0.75  # ties inside every group
    s[5] = torch.randn(32, generator=torch.Generator().manual_seed(2))
    b = torch.zeros(32)
    for kept in (1, 2, 3):
        check(s, b, 4, device, num_expert_group=8, topk_group=kept)
    assert (route(s, b, 4, device, num_expert_group=8, topk_group=1)[1][0] >= 8).all()  # group 2 of the tie
    assert (route(s, b, 4, device, num_expert_group=8, topk_group=1)[1][0] < 12).all()


@pytest.mark.parametrize("device", DEVICES)
def test_group_ties_in_groups_of_32(group_warps, device):
    """``test_group_ties`` where each group is one warp's register (8 groups of 32): sums alike
    from different pairs (the lower group wins), all-equal rows, -0.0 against +0.0, a group of
    +inf and -inf (NaN: last), a NaN group, ties inside every group, and the kept groups' keys
    negative."""
    inf = float("inf")
    s = torch.full((8, 256), 0.125)
    s[0, 64:68] = torch.tensor([0.5, 0.25, 0.0, 0.0])
    s[0, 160:164] = torch.tensor([0.375, 0.375, 0.0, 0.0])
    s[1] = 0.25
    s[2, :32] = -0.0
    s[2, 32:] = -1.0
    s[2, 224:] = 0.0
    s[3, :32] = -inf
    s[3, 0] = inf
    s[3, 32:] = -1.0
    s[4, ::2] = 0.75
    s[5, 96:128] = float("nan")
    s[5, 128:160] = -0.5
    s[6] = -torch.rand(256, generator=torch.Generator().manual_seed(3))
    s[7] = torch.randn(256, generator=torch.Generator().manual_seed(2))
    b = torch.zeros(256)
    for kept in (1, 2, 3, 8):
        check(s, b, 8, device, num_expert_group=8, topk_group=kept)
    _, ids = route(s, b, 8, device, num_expert_group=8, topk_group=1)
    assert ((ids[0] >= 64) & (ids[0] < 96)).all()  # group 2 of the tie with group 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk", [(512, 22), (1024, 32), (1024, 23), (33, 32), (32, 32)])
def test_topk_up_to_32(device, experts, topk):
    for kind in ("random", "all_equal", "few_distinct", "nan_mixed", "inf_mixed"):
        s = scores(kind, (17, experts), seed=topk)
        check(s, torch.randn(experts, generator=torch.Generator().manual_seed(3)) * 0.01, topk, device, scale=1.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("groups,kept", [(1, 1), (8, 4)])
def test_half_precision_scores_widen_exactly(group_warps, device, dtype, groups, kept):
    """bf16 / fp16 scores rank as their exact fp32 values (ties that only the narrow type makes
    stay ties, broken by the lower id); weights in fp32 or in the scores' dtype (the fp32 weights
    rounded once); the bias in fp32 or in the scores' dtype."""
    s = torch.sigmoid(scores("random", (40, 256), seed=9)).to(dtype)
    s[1] = s[1, :1]  # all equal in the narrow type
    s[2, ::3] = s[2, 0]
    s[3, :8] = float("nan")
    s[4, 100:] = -0.0
    b32 = torch.randn(256, generator=torch.Generator().manual_seed(4)) * 0.01
    for b in (b32, b32.to(dtype), torch.zeros(256)):
        for weights_dtype in (torch.float32, dtype):
            check(s, b, 8, device, weights_dtype, num_expert_group=groups, topk_group=kept, scale=2.5)
            check(s, b, 8, device, weights_dtype, num_expert_group=groups, topk_group=kept, apply_sigmoid=True)
    want = route(s.float(), b32, 8, device, num_expert_group=groups, topk_group=kept)
    assert all(torch.equal(g, w) for g, w in zip(route(s, b32, 8, device, num_expert_group=groups,
                                                       topk_group=kept), want))


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_largest_batch(group_warps, device):
    s = torch.sigmoid(scores("random", (8192, 256), seed=13))
    s[::5] = 0.5  # CUDA-graph padding rows
    s[1::5, 64:96] = float("nan")
    check(s, scores("few_distinct", (256,), seed=14) * 0.01, 8, device, num_expert_group=8, topk_group=4, scale=2.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experts,topk,groups,second", [(64, 4, 32, 16), (512, 20, 32, 16), (1024, 32, 32, 16),
                                                         (544, 20, 32, 15)])
def test_kept_experts_in_fewer_lanes_than_topk(group_warps, device, experts, topk, groups, second):
    """The kept groups' experts share fewer threshold groups than topk (64 / 4: 2 lanes; 544 / 20:
    18 of the lane halves that topk > 16 uses): the topk-th largest maximum is then no real key,
    and the threshold must admit every key. Negative scores, so a threshold read from
    uninitialized shared memory (0, say) would drop them. (The kernel once left the threshold
    unwritten there.) The other shapes keep two groups on the same lanes."""
    size = experts // groups
    s = torch.full((5, experts), -1.0)
    first = 0
    s[:, first * size:(first + 1) * size] = -0.5
    s[:, second * size:(second + 1) * size] = -0.25
    s[1] = s[1] - torch.arange(experts) * 1e-3  # no ties
    s[2, first * size:(first + 1) * size] = float("-inf")  # group 0 drops out: group 1 is kept instead
    check(s, torch.zeros(experts), topk, device, num_expert_group=groups, topk_group=2)
    _, ids = route(s, torch.zeros(experts), topk, device, num_expert_group=groups, topk_group=2)
    rows = [0, 1, 3, 4]
    assert (((ids[rows] // size) == first) | ((ids[rows] // size) == second)).all()


def test_programmatic_dependent_launch_follows_the_switch():
    """The catalog and the op take the build ``kernels/pdl.py`` asks for moe_route: its per-op
    default, or every op's (TORCH_SPARSE_DECODE_PDL=1 / 0)."""
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.kernels.compile import Target, MODELS
    from torch_sparse_decode.ops.moe_route import kernel

    assert pdl.ON == {"1": True, "0": False}.get(os.environ.get("TORCH_SPARSE_DECODE_PDL", ""))
    catalog = kernel.compiled.catalog(Target("sm_90a", 132, MODELS))
    assert {config[9] for config in catalog} == {pdl.enabled(pdl.ROUTE)}
    assert {config[10:] for config in catalog} == {(kernel.GROUP_WARPS,)}


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("device", ["cuda"])
def test_results_unchanged_as_a_programmatic_dependent(group_warps, monkeypatch, graph):
    """Launched as a programmatic dependent of the router GEMM that writes its logits (eagerly and
    in a CUDA graph, fresh inputs each replay): the ids and weights of the reference on those
    logits, every time (a read before the GEMM finished would give another answer)."""
    from graphs import capture_graph
    from torch_sparse_decode.kernels import pdl

    monkeypatch.setattr(pdl, "ON", True)
    gen = torch.Generator().manual_seed(7)
    gate = (torch.randn(256, 2048, generator=gen) * 0.03).cuda()
    bias = (torch.randn(256, generator=gen) * 0.05).cuda()

    def step(hidden):
        logits = hidden @ gate.t()  # cuBLAS, the kernel before
        weights, ids = tsd.moe_route(logits, bias, 8, scale=2.5, apply_sigmoid=True, num_expert_group=8, topk_group=4)
        return logits, weights, ids

    inputs = [torch.randn(64, 2048, generator=gen).cuda() for _ in range(4)]
    run = capture_graph(step, inputs[0].clone()) if graph else step
    for hidden in inputs:
        logits, weights, ids = (t.clone() for t in run(hidden))
        want = torch.empty_like(weights), torch.empty_like(ids)
        reference.moe_route(logits, bias, 8, True, 2.5, True, 8, 4, *want)
        assert torch.equal(ids, want[1]) and torch.equal(weights, want[0])
