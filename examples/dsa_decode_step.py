"""A DeepSeek-V3.2-style decode step on a paged KV cache, with torch_sparse_decode's ops.

    python examples/dsa_decode_step.py [--batch 8] [--context 8192] [--device cuda|cpu]

One step for a batch of requests, each with its own length in a paged cache:

1. the lightning indexer's scores in torch: ``sum_h w[h] * relu(q_h . k_t)`` over the request's
   cached indexer keys;
2. ``tsd.indexer_topk_fused``: the exact top-k positions of each request's valid prefix, written
   as KV slots through the page table (``page_table[r, pos // page_size] * page_size + pos %
   page_size``) in the same launch;
3. a gather of the selected latent KV;
4. attention over the selected tokens only (``scaled_dot_product_attention``, the -1 padding
   masked);
5. ``tsd.moe_route`` on the step's router scores (DeepSeek-V3's grouped routing: 256 experts in 8
   groups, 4 kept, top 8, scale 2.5).

The step runs eager, under ``torch.compile(fullgraph=True)`` and, on a GPU, captured in a CUDA
graph that is replayed with new inputs; the time of one step in each mode is printed. On a GPU,
eager runs the CUDA kernels and is checked against the reference (the same step on the CPU,
where every op runs its pure-PyTorch implementation); on the CPU, eager *is* the reference. Every
other mode is checked against eager: slots and routing exactly, the routing as ``moe_route``
gives it on that mode's own router scores (whose sigmoid a compiled graph may round an ulp
differently).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import torch_sparse_decode as tsd


@dataclass
class Config:
    batch: int = 8
    context: int = 8192  # the longest request's cached tokens
    page_size: int = 64
    topk: int = 2048  # tokens each query attends to
    heads: int = 16  # attention heads (MLA: one shared latent KV)
    latent: int = 128  # the latent KV width (a stand-in for MLA's 512 + 64)
    index_heads: int = 8
    index_dim: int = 64
    hidden: int = 256  # the router's input width (a stand-in for 7168)
    experts: int = 256


def grid(x: torch.Tensor) -> torch.Tensor:
    """The indexer's q and k on a coarse grid (multiples of 1/4 in [-2, 2], as an FP8 indexer cache
    holds few values), so its scores are exact in fp32 in any summation order: eager and compiled
    steps then select the same tokens, ties included."""
    return (x * 4).round().clamp(-8, 8) / 4


def make_cache(cfg: Config, device: torch.device, seed: int = 0):
    """The paged caches and each request's pages (shuffled, as an allocator leaves them)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_request = -(-cfg.context // cfg.page_size)
    pages = cfg.batch * pages_per_request
    page_table = torch.randperm(pages, generator=gen).view(cfg.batch, pages_per_request).to(torch.int32)
    kv_cache = torch.randn(pages, cfg.page_size, cfg.latent, generator=gen)
    index_cache = grid(torch.randn(pages, cfg.page_size, cfg.index_dim, generator=gen))
    return page_table.to(device), kv_cache.to(device), index_cache.to(device)


def make_step_inputs(cfg: Config, device: torch.device, seed: int):
    """One step's inputs: lengths, the queries, the indexer's weights and the router's input."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, cfg.context + 1, (cfg.batch,), generator=gen, dtype=torch.int32)
    seq_lens[0] = cfg.context  # one full-length request
    q = torch.randn(cfg.batch, cfg.heads, cfg.latent, generator=gen)
    q_index = grid(torch.randn(cfg.batch, cfg.index_heads, cfg.index_dim, generator=gen))
    w_index = torch.randint(1, 17, (cfg.batch, cfg.index_heads), generator=gen) / 16
    hidden = torch.randn(cfg.batch, cfg.hidden, generator=gen)
    return [t.to(device) for t in (seq_lens, q, q_index, w_index, hidden)]


class DecodeStep(torch.nn.Module):
    def __init__(self, cfg: Config, page_table, kv_cache, index_cache, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.page_table, self.kv_cache, self.index_cache = page_table, kv_cache, index_cache
        gen = torch.Generator().manual_seed(7)
        self.gate = (torch.randn(cfg.experts, cfg.hidden, generator=gen) / cfg.hidden ** 0.5).to(device)
        self.bias = (torch.randn(cfg.experts, generator=gen) * 0.05).to(device)

    def forward(self, seq_lens, q, q_index, w_index, hidden):
        cfg = self.cfg
        # 1. Indexer scores over every cached position of each request (positions past a request's
        # length hold other data; indexer_topk reads only the valid prefix).
        keys = self.index_cache[self.page_table.long()].flatten(1, 2)  # [B, pages * page_size, Di]
        logits = torch.einsum("bhd,btd->bht", q_index, keys)
        scores = (w_index[:, :, None] * torch.relu(logits)).sum(dim=1)  # [B, T] fp32

        # 2-3. The exact top-k positions (ascending, -1 padded), written as KV slots through the
        # page table by the selection's own output stage; then the selected latent KV.
        slots = tsd.indexer_topk_fused(scores, seq_lens, cfg.topk, page_table=self.page_table,
                                       page_size=cfg.page_size).out
        valid = slots >= 0
        kv = self.kv_cache.view(-1, cfg.latent)[slots.clamp(min=0).long()]  # [B, topk, latent]

        # 4. Attention over the selected tokens (MLA-style: the latent is both key and value).
        mask = valid[:, None, None, :]  # [B, 1, 1, topk]
        out = F.scaled_dot_product_attention(q[:, :, None, :], kv[:, None], kv[:, None], attn_mask=mask)

        # 5. The MoE router: sigmoid scores, DeepSeek-V3's grouped routing.
        router = torch.sigmoid(hidden @ self.gate.T)
        weights, experts = self.route(router)
        return out[:, :, 0], slots, weights, experts, router

    def route(self, router):
        return tsd.moe_route(router, self.bias, 8, scale=2.5, num_expert_group=8, topk_group=4)


def timed(fn, *args, repeats: int = 20) -> float:
    """Milliseconds per call (after one untimed call)."""
    fn(*args)
    if args[0].is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    if args[0].is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def routing_differs(step: DecodeStep, weights, experts, router) -> list[str]:
    """The routing outputs that differ from what ``step.route`` gives on these router scores."""
    routed = step.route(router)
    pairs = (("weights", weights, routed[0]), ("experts", experts, routed[1]))
    return [name for name, got, want in pairs if not torch.equal(got, want)]


def differs(step: DecodeStep, got, want) -> list[str]:
    """The outputs that differ. Slots exactly. The routing exactly too, as ``moe_route`` gives it
    on the mode's own router scores; those and the attention output to fp32 rounding: a compiled
    graph computes the softmax and the router's sigmoid in its own kernels, which may round an
    ulp differently."""
    attention, slots, weights, experts, router = got
    bad = ([] if torch.equal(slots, want[1]) else ["slots"]) + routing_differs(step, weights, experts, router)
    if not torch.equal(experts, want[3]):
        bad.append("experts (vs eager)")
    for name, g, w, tol in (("attention", attention, want[0], 1e-6), ("router scores", router, want[4], 0.0),
                            ("weights", weights, want[2], 0.0)):
        if not torch.allclose(g, w, rtol=1e-5, atol=tol):
            bad.append(f"{name} (max error {(g - w).abs().max().item():.2e})")
    return bad


def differs_from_reference(cfg: Config, got, inputs) -> list[str]:
    """The outputs of a step on the GPU that differ from the reference's: the same step on CPU
    copies, where every op runs its reference. Slots exactly, the routing exactly as the
    reference routes the GPU's router scores, the attention to fp32 rounding."""
    cpu = torch.device("cpu")
    reference = DecodeStep(cfg, *make_cache(cfg, cpu), cpu)
    attention, slots, weights, experts, router = (t.cpu() for t in got)
    want = reference(*(t.cpu() for t in inputs))
    bad = ([] if torch.equal(slots, want[1]) else ["slots"]) + routing_differs(reference, weights, experts, router)
    if not torch.allclose(attention, want[0], rtol=1e-4, atol=1e-5):
        bad.append(f"attention (max error {(attention - want[0]).abs().max().item():.2e})")
    return bad


def run(cfg: Config, device: torch.device, modes=("eager", "compiled", "graph"), steps: int = 3) -> dict:
    """Each mode on ``steps`` fresh input sets, checked (eager on a GPU against the reference, the
    other modes against eager); returns ms per step."""
    step = DecodeStep(cfg, *make_cache(cfg, device), device)
    inputs = [make_step_inputs(cfg, device, seed) for seed in range(steps)]
    if device.type == "cuda":
        tsd.warmup(device)
    want = [step(*x) for x in inputs]
    if device.type == "cuda":
        for x, w in zip(inputs, want):
            bad = differs_from_reference(cfg, w, x)
            assert not bad, f"the CUDA kernels' step differs from the reference's: {bad}"
    times = {"eager": timed(step, *inputs[0])}
    if "compiled" in modes:
        compiled = torch.compile(step, fullgraph=True)
        for x, w in zip(inputs, want):
            bad = differs(step, compiled(*x), w)
            assert not bad, f"torch.compile output differs from eager: {bad}"
        times["compiled"] = timed(compiled, *inputs[0])
    if "graph" in modes and device.type == "cuda":
        static = [t.clone() for t in inputs[0]]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(*static)  # allocations and kernel loads before capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = step(*static)
        for x, w in zip(inputs[::-1], want[::-1]):  # replays with new inputs
            for s, t in zip(static, x):
                s.copy_(t)
            graph.replay()
            torch.cuda.synchronize()
            bad = differs(step, result, w)
            assert not bad, f"CUDA graph replay differs from eager: {bad}"
        times["graph"] = timed(lambda *_: graph.replay(), *static)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    cfg = Config(batch=args.batch, context=args.context, topk=min(2048, args.context))
    device = torch.device(args.device)
    print(f"DSA decode step: {cfg.batch} requests, up to {cfg.context} cached tokens each, top {cfg.topk}, "
          f"on {device}")
    start = time.perf_counter()
    checked = {"eager": "the CUDA kernels, checked against the reference (the same step on the CPU)"
               if device.type == "cuda" else "the reference: on the CPU every op runs its pure-PyTorch implementation"}
    for mode, ms in run(cfg, device).items():
        print(f"  {mode:9s} {ms:8.3f} ms per step ({checked.get(mode, 'output checked against eager')})")
    print(f"done in {time.perf_counter() - start:.1f} s (warmup() and compiles included)")


if __name__ == "__main__":
    main()
