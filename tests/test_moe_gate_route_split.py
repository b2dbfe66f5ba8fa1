"""The router GEMM split over the GPU (``ops/moe_gate_route/split.py``): its logits within the fp32
accumulation bound of the exact product, the same every run, written whole and nowhere else,
its arrival counters back to zero after each launch; in the CPU interpreter (CI) and on the GPU,
where the op routes them (``TORCH_SPARSE_DECODE_ROUTER_SPLIT=1``; forced here)."""

from __future__ import annotations

import pytest
import torch

import oracle
from inputs import DEVICES, poisoned
from test_moe_gate_route import SHAPES, assert_routed, inputs
from torch_sparse_decode.ops.moe_gate_route import split

# (tokens, experts, width): the models' routers at decode batches (every padding of the batch),
# then edges: experts not a multiple of a tile, a width not a multiple of BLOCK_K or of a slice.
CASES = [(1, 896, 7168), (3, 256, 7168), (16, 384, 7168), (17, 896, 7168), (64, 256, 7168), (33, 1024, 7168),
         (5, 100, 1000), (2, 17, 72), (64, 512, 256), (1, 1, 64)]


def run(hidden, gate, device, arrivals=None):
    out = poisoned((hidden.shape[0], gate.shape[0]), torch.float32, device)
    arrivals = split.counters(device, gate.shape[0]) if arrivals is None else arrivals
    split.router_logits(hidden.to(device), gate.to(device), out, arrivals)
    assert not arrivals.any()  # every tile's counter reset for the next launch
    return out.cpu()


def assert_within_bound(hidden, gate, logits):
    exact = hidden.double() @ gate.double().T
    bound, magnitude = oracle.accumulation_bound(hidden, gate)
    inside = magnitude <= torch.finfo(torch.float32).max
    err = (logits.double() - exact).abs()
    assert torch.all(err[inside] <= bound[inside]), err[inside].max()
    assert torch.isnan(logits[torch.isnan(exact)]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,experts,width", CASES)
def test_logits_within_the_accumulation_bound_and_the_same_every_run(device, tokens, experts, width):
    hidden, gate, _ = inputs(tokens, experts, width, tokens + experts, "cpu")
    logits = run(hidden, gate, device)
    assert_within_bound(hidden, gate, logits)
    assert torch.equal(logits, run(hidden, gate, device))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_and_zero_hidden_states(device):
    """NaN rows give NaN logits, an inf row what the product gives, zero rows (CUDA-graph padding)
    zero logits; the other rows are untouched by them."""
    hidden, gate, _ = inputs(6, 256, 7168, 3, "cpu")
    hidden[1, 100] = float("nan")
    hidden[2, 5] = float("inf")
    hidden[3] = 0
    hidden[4, ::7] = -0.0
    logits = run(hidden, gate, device)
    assert torch.isnan(logits[1]).all() and torch.equal(logits[3], torch.zeros(256))
    assert_within_bound(hidden, gate, logits)


def test_the_plan_fills_the_gpu_and_bounds_the_last_ctas_reads():
    for tokens in (1, 8, 16, 17, 64):
        for experts in (256, 384, 512, 896, 1024):
            p = split.plan(tokens, experts, 7168)
            tiles, parts = p.grid(experts)
            assert p.block_t >= max(tokens, split.MIN_BLOCK_T) and p.k_split % split.BLOCK_K == 0
            assert (parts - 1) * p.k_split < 7168 <= parts * p.k_split  # every column, no empty slice
            assert parts * tokens * p.block_e * 4 <= split.REDUCE_BYTES
            assert split.CTAS // 2 <= tiles * parts <= 2 * split.CTAS or parts * p.block_t * p.block_e * 4 * 2 > \
                split.REDUCE_BYTES
    assert split.plan(1, 1, 64) == split.Plan(16, 16, 1, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_a_counter_not_reset_would_show(device):
    """The last CTA of a tile is the one that finds SPLIT - 1 arrivals before its own. A counter
    left at SPLIT by a launch that did not reset it: no CTA of the next launch sums that tile,
    whose logits stay poisoned (so such a launch fails the tests above on its second run)."""
    hidden, gate, _ = inputs(2, 64, 7168, 5, "cpu")
    p = split.plan(2, 64, 7168)
    arrivals = split.counters(device, 64)
    arrivals[0] = p.split
    out = poisoned((2, 64), torch.float32, device)
    split.router_logits(hidden.to(device), gate.to(device), out, arrivals)
    assert torch.isnan(out[:, :p.block_e].cpu()).all() and not torch.isnan(out[:, p.block_e:].cpu()).any()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=["kimi_k3", "deepseek_v3"])
@pytest.mark.parametrize("tokens", [1, 4, 5, 8, 16, 33, 64])
def test_the_op_routes_the_split_gemms_logits(monkeypatch, shape, tokens):
    """With the switch on and the front off (it keeps T <= 4 otherwise), decode batches take the
    split GEMM, and the routing is ``moe_route``'s of its logits, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch_sparse_decode as tsd
    from torch_sparse_decode.ops.moe_gate_route import kernel

    monkeypatch.setattr(split, "SPLIT", True)
    monkeypatch.setattr(kernel, "FRONT_TOKENS", 0)
    experts, width, topk, groups, kept, scale = shape
    hidden, gate, bias = inputs(tokens, experts, width, 200 + tokens, "cuda")
    assert split.takes(hidden, gate) and not kernel.uses_front(hidden, gate)
    out = (poisoned((tokens, topk), torch.float32, "cuda"), poisoned((tokens, topk), torch.int32, "cuda"),
           poisoned((tokens, experts), torch.float32, "cuda"))
    tsd.moe_gate_route(hidden, gate, bias, topk, scale=scale, num_expert_group=groups, topk_group=kept, out=out)
    assert_routed(hidden, gate, bias, topk, groups, kept, scale, True, *out)


@pytest.mark.gpu
@pytest.mark.parametrize("dependent", [False, True], ids=["plain", "pdl"])
def test_graph_replays_with_fresh_inputs(monkeypatch, dependent):
    """Captured in a CUDA graph (the counters made by the call before the capture), two layers
    back to back each replay, with fresh hidden states: every replay routes its own logits, so
    the counters came back to zero each time; plain and as programmatic dependents."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch_sparse_decode as tsd
    from graphs import capture_graph
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.ops.moe_gate_route import kernel

    monkeypatch.setattr(split, "SPLIT", True)
    monkeypatch.setattr(kernel, "FRONT_TOKENS", 0)
    monkeypatch.setattr(pdl, "ON", dependent)
    experts, width, topk, groups, kept, scale = SHAPES[1]
    _, gate, bias = inputs(1, experts, width, 3, "cuda")

    def step(x):
        first = tsd.moe_gate_route(x, gate, bias, topk, scale=scale, num_expert_group=groups, topk_group=kept)
        return first, tsd.moe_gate_route(x * 2, gate, bias, topk, scale=scale, num_expert_group=groups,
                                         topk_group=kept)

    sets = [inputs(24, experts, width, seed, "cuda")[0] for seed in range(30, 34)]
    run = capture_graph(step, sets[0])
    for x in sets * 2:
        for hidden, outs in zip((x, x * 2), run(x)):
            assert_routed(hidden, gate, bias, topk, groups, kept, scale, True, *outs)
