"""CUDA-graph capture of every op, replayed on fresh inputs, against the CPU reference."""

import pytest
import torch

import torch_sparse_decode as tsd
from inputs import scores
from torch_sparse_decode import dcp
from graphs import capture_graph, replay_matches

pytestmark = pytest.mark.gpu


def _fresh(make, steps=4):
    return [make(seed) for seed in range(100, 100 + steps)]


def test_warmup_on_cuda():
    assert tsd.warmup() >= 1


def test_after_warmup_the_examples_compile_nothing(monkeypatch):
    """warmup() loads every configuration the ops take at the demo's shapes (its catalogs), so
    no first call compiles (a compile inside a CUDA graph capture would fail)."""
    import cutlass.cute as cute

    from torch_sparse_decode.demo import run_examples

    tsd.warmup()
    monkeypatch.setattr(cute, "compile", lambda *a, **k: pytest.fail("an op compiled after warmup()"))
    assert all(row["ok"] for row in run_examples(torch.device("cuda"), check=True))


def test_moe_route_graph_replay():
    bias = torch.randn(896).cuda() * 0.1

    def make(seed):
        return (torch.sigmoid(scores("random" if seed % 2 else "few_distinct", (64, 896), seed)).cuda(),)

    def step(s):
        return tsd.moe_route(s, bias, 16, scale=2.5)

    def ref(s):
        return tsd.moe_route(s.cpu(), bias.cpu(), 16, scale=2.5)

    graphed = capture_graph(step, *make(0))
    for inputs in _fresh(make):
        w, i = graphed(*inputs)
        want_w, want_i = ref(*inputs)
        assert torch.equal(i.cpu(), want_i)
        torch.testing.assert_close(w.cpu(), want_w, rtol=4e-7, atol=0)


def test_grouped_moe_route_graph_replay():
    """DeepSeek-V3's routing (bf16 logits, 256 experts in 8 groups, 4 kept, top 8) replayed with
    new inputs: bit-identical to the reference on the same device."""
    from torch_sparse_decode.ops.moe_route import reference

    bias = (torch.randn(256) * 0.1).cuda()

    def make(seed):
        return (scores("random" if seed % 2 else "few_distinct", (64, 256), seed).to(torch.bfloat16).cuda(),)

    def step(s):
        return tsd.moe_route(s, bias, 8, scale=2.5, apply_sigmoid=True, num_expert_group=8, topk_group=4)

    graphed = capture_graph(step, *make(0))
    for inputs in _fresh(make):
        w, i = graphed(*inputs)
        want_w, want_i = torch.empty_like(w), torch.empty_like(i)
        reference.moe_route(inputs[0], bias, 8, True, 2.5, True, 8, 4, want_w, want_i)
        assert torch.equal(i, want_i) and torch.equal(w, want_w)


def test_topk_ops_graph_replay():
    def make(seed):
        gen = torch.Generator().manual_seed(seed)
        logits = scores("relu_zeros", (8, 128 * 1024), seed).cuda()
        ends = torch.randint(0, 128 * 1024 + 1, (8,), generator=gen, dtype=torch.int32).cuda()
        starts = torch.randint(-5, 128 * 1024, (8,), generator=gen, dtype=torch.int32).cuda()
        return logits, ends, starts

    def step(logits, ends, starts):
        return (
            tsd.select_candidate_blocks(logits, ends, 64, 2048),
            tsd.indexer_topk(logits, ends, 2048),
            tsd.select_candidate_blocks(logits, ends, 8, 512, row_starts=starts),
            tsd.indexer_topk(logits, ends, 2048, row_starts=starts),
            tsd.decode_row_lengths(ends, 3),
        )

    def ref(logits, ends, starts):
        logits, ends, starts = logits.cpu(), ends.cpu(), starts.cpu()
        return (tsd.select_candidate_blocks(logits, ends, 64, 2048), tsd.indexer_topk(logits, ends, 2048),
                tsd.select_candidate_blocks(logits, ends, 8, 512, row_starts=starts),
                tsd.indexer_topk(logits, ends, 2048, row_starts=starts), tsd.decode_row_lengths(ends, 3))

    graphed = capture_graph(step, *make(0))
    assert replay_matches(graphed, _fresh(make), ref) == 4


def test_dcp_simulated_graph_replay():
    def make(seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 8, 16384, generator=gen).cuda()
        lengths = torch.randint(0, 16385, (4, 8), generator=gen, dtype=torch.int32).cuda()
        return x, lengths

    def step(x, lengths):
        return dcp.simulate_dcp_topk(x, lengths, 2048)

    def ref(x, lengths):
        return dcp.simulate_dcp_topk(x.cpu(), lengths.cpu(), 2048)

    graphed = capture_graph(step, *make(0))
    assert replay_matches(graphed, _fresh(make), ref) == 4
