"""moe_gate_route: the router front. Its logits within the fp32 accumulation bound of the exact
product, its routing exactly moe_route's of their sigmoid on the same device; adversarial rows
(NaN hidden states, all-equal logits, tied experts), T = 0..64, the two model shapes, a CUDA
graph replayed with fresh inputs, torch.compile, bad arguments."""

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, poisoned

# (experts, hidden, topk, num_expert_group, topk_group, scale): Kimi K3, DeepSeek-V3
SHAPES = [(896, 7168, 16, 1, 1, 2.5), (256, 7168, 8, 8, 4, 2.5)]


def inputs(tokens, experts, width, seed, device):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=gen).bfloat16()
    gate = (torch.randn(experts, width, generator=gen) * width ** -0.5).bfloat16()
    bias = torch.randn(experts, generator=gen) * 0.05
    return hidden.to(device), gate.to(device), bias.to(device)


def check(hidden, gate, bias, topk, groups, kept, scale, renormalize=True):
    tokens, experts = hidden.shape[0], gate.shape[0]
    out = (poisoned((tokens, topk), torch.float32, hidden.device), poisoned((tokens, topk), torch.int32, hidden.device),
           poisoned((tokens, experts), torch.float32, hidden.device))
    weights, ids, logits = tsd.moe_gate_route(hidden, gate, bias, topk, renormalize=renormalize, scale=scale,
                                              num_expert_group=groups, topk_group=kept, out=out)
    assert weights is out[0] and ids is out[1] and logits is out[2]
    assert_routed(hidden, gate, bias, topk, groups, kept, scale, renormalize, weights, ids, logits)
    return weights, ids, logits


def assert_routed(hidden, gate, bias, topk, groups, kept, scale, renormalize, weights, ids, logits):
    """The logits within the fp32 accumulation bound of the exact product, and the routing that of
    ``moe_route`` on their sigmoid, bit for bit."""
    tokens = hidden.shape[0]
    f32, i32 = dict(dtype=torch.float32), dict(dtype=torch.int32)
    exact = hidden.double() @ gate.double().T
    bound, magnitude = oracle.accumulation_bound(hidden, gate)
    inside = magnitude <= torch.finfo(torch.float32).max  # no partial sum overflows (nor NaN inputs)
    err = (logits.double() - exact).abs()
    assert torch.all(err[inside] <= bound[inside]), err[inside].max()
    assert torch.isnan(logits[torch.isnan(exact)]).all()
    want = tsd.moe_route(torch.sigmoid(logits), bias, topk, renormalize=renormalize, scale=scale,
                         num_expert_group=groups, topk_group=kept,
                         out=(torch.empty(tokens, topk, device=hidden.device, **f32),
                              torch.empty(tokens, topk, device=hidden.device, **i32)))
    assert torch.equal(ids, want[1])
    assert torch.equal(weights.view(torch.int32), want[0].view(torch.int32))  # bit for bit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=["kimi_k3", "deepseek_v3"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 200])  # <= 4: the one-launch front on a GPU
def test_routing_is_moe_route_of_its_own_logits(device, shape, tokens):
    experts, width, topk, groups, kept, scale = shape
    check(*inputs(tokens, experts, width, tokens, device), topk, groups, kept, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=["kimi_k3", "deepseek_v3"])
@pytest.mark.parametrize("tokens", [5, 8, 9, 16])
def test_the_front_kernel_up_to_its_own_limit(monkeypatch, shape, tokens):
    """The op sends the front T <= FRONT_TOKENS (where it is measured to win), but the kernel
    takes up to front.MAX_TOKENS, several chunks of hidden vectors: exact there too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch_sparse_decode.ops.moe_gate_route import front, kernel

    monkeypatch.setattr(kernel, "FRONT_TOKENS", front.MAX_TOKENS)
    experts, width, topk, groups, kept, scale = shape
    hidden, gate, bias = inputs(tokens, experts, width, 100 + tokens, "cuda")
    assert kernel.uses_front(hidden, gate)
    check(hidden, gate, bias, topk, groups, kept, scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("front_tokens", [None, 16], ids=["op", "front_up_to_16"])
def test_adversarial_rows(device, front_tokens, monkeypatch):
    """NaN hidden states (NaN logits: the routing's NaN rule), zero rows (every logit 0: all
    tie, lowest ids win), tied experts (duplicate gate rows), a huge row (logits overflow to
    +-inf), and no renormalization; through the op's own path, and (GPU) through the front for
    the whole batch of 8."""
    if front_tokens is not None:
        if device == "cpu":
            pytest.skip("the front is a CUDA kernel")
        from torch_sparse_decode.ops.moe_gate_route import kernel

        monkeypatch.setattr(kernel, "FRONT_TOKENS", front_tokens)
    experts, width, topk = 896, 7168, 16
    hidden, gate, bias = inputs(8, experts, width, 5, "cpu")
    hidden[1, 3] = float("nan")
    hidden[2] = 0.0
    gate[100:140] = gate[99]  # 41 experts with one logit
    bias[100:140] = bias[99]
    hidden[4] = 3e38
    hidden, gate, bias = hidden.to(device), gate.to(device), bias.to(device)
    weights, ids, logits = check(hidden, gate, bias, topk, 1, 1, 1.0)
    assert torch.isnan(logits[1]).all() and torch.equal(logits[2], torch.zeros_like(logits[2]))
    keys = 0.5 + bias.cpu()  # sigmoid(0) + bias: ties go to the lower expert
    assert torch.equal(ids[2].cpu(), torch.argsort(keys, descending=True, stable=True)[:topk].int())
    check(hidden, gate, bias, topk, 1, 1, 1.0, renormalize=False)
    check(hidden[:, :256].contiguous(), gate[:256, :256].contiguous(), bias[:256], 8, 8, 4, 2.5)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    hidden, gate, bias = inputs(0, 256, 512, 0, device)
    weights, ids, logits = tsd.moe_gate_route(hidden, gate, bias, 8)
    assert weights.shape == (0, 8) and ids.shape == (0, 8) and logits.shape == (0, 256)


@pytest.mark.parametrize("device", DEVICES)
def test_under_torch_compile(device):
    torch._dynamo.reset()
    hidden, gate, bias = inputs(4, 256, 1024, 1, device)

    def step(h):
        weights, ids, logits = tsd.moe_gate_route(h, gate, bias, 8, scale=2.5, num_expert_group=8, topk_group=4)
        return weights * 2, ids, logits

    got = torch.compile(step, fullgraph=True)(hidden)
    want = step(hidden)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.gpu
def test_graph_replay_with_fresh_inputs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch_sparse_decode.ops.moe_gate_route import kernel

    sets = [inputs(4, 896, 7168, seed, "cuda") for seed in range(4)]
    static = [t.clone() for t in sets[0]]
    assert kernel.uses_front(static[0], static[1])  # the mailbox's parity alternates over the replays
    tsd.moe_gate_route(*static, 16, scale=2.5)  # compiles and loads before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = tsd.moe_gate_route(*static, 16, scale=2.5)
    for hidden, gate, bias in sets[::-1] * 2:
        for s, t in zip(static, (hidden, gate, bias)):
            s.copy_(t)
        graph.replay()
        want = tsd.moe_gate_route(hidden, gate, bias, 16, scale=2.5)
        assert all(torch.equal(g, w) for g, w in zip(result, want))


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("shape", SHAPES, ids=["kimi_k3", "deepseek_v3"])
def test_results_unchanged_as_a_programmatic_dependent(monkeypatch, graph, shape):
    """Launched as programmatic dependents (``kernels/pdl.py``): three fronts back to back after
    the kernel that writes their hidden states, each a dependent of the one before (whose mailbox
    parity it reads after its wait), eagerly and in a CUDA graph with fresh inputs each replay.
    Each routes its own logits every time (a read before the kernel before finished would not)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from graphs import capture_graph
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.ops.moe_gate_route import kernel

    monkeypatch.setattr(pdl, "ON", True)
    experts, width, topk, groups, kept, scale = shape
    _, gate, bias = inputs(1, experts, width, 11, "cuda")
    spans = ((0, 4), (1, 2), (1, 4))  # 16-byte aligned rows: each a front launch

    def step(x):
        hidden = x * 2  # the kernel before: it writes the hidden states
        return [(hidden[a:b], *tsd.moe_gate_route(hidden[a:b], gate, bias, topk, scale=scale, num_expert_group=groups,
                                                  topk_group=kept)) for a, b in spans]

    sets = [inputs(4, experts, width, seed, "cuda")[0] for seed in range(20, 24)]
    assert kernel.uses_front(sets[0], gate)
    run = capture_graph(step, sets[0]) if graph else step
    for x in sets * 2:
        for hidden, weights, ids, logits in run(x):
            assert_routed(hidden, gate, bias, topk, groups, kept, scale, True, weights, ids, logits)


@pytest.mark.gpu
def test_a_record_never_published_ends_in_the_error_word():
    """A producer that never publishes an expert's record: the consumers' wait runs out, the
    launch finishes (no hang), and the host check raises; the next launch is clean again."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch_sparse_decode.ops.moe_gate_route import kernel

    hidden, gate, bias = inputs(4, 256, 7168, 9, "cuda")
    out = (torch.empty(4, 8, device="cuda"), torch.empty(4, 8, dtype=torch.int32, device="cuda"),
           torch.empty(4, 256, device="cuda"))
    tsd.moe_gate_route_check()
    kernel.moe_gate_route(hidden, gate, bias, 8, True, 2.5, 8, 4, *out, timeout_ns=1_000_000, skip=5)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="timed out waiting for its score records"):
        tsd.moe_gate_route_check()
    tsd.moe_gate_route_check()  # reported once; the mailbox was made anew
    check(hidden, gate, bias, 8, 8, 4, 2.5)
