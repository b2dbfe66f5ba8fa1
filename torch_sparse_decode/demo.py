"""One small, realistic example per op: used by the demo (``python -m torch_sparse_decode``) and
by ``warmup()``. Each example runs the op on a device and can check it against the reference run
on CPU copies of the same inputs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import dcp
from .ops.decode_row_lengths.op import decode_row_lengths
from .ops.indexer_topk.op import indexer_topk
from .ops.indexer_topk_fused.op import indexer_topk_fused
from .ops.moe_gate_route.op import moe_gate_route
from .ops.moe_route.op import moe_route
from .ops.select_candidate_blocks.op import select_candidate_blocks
from .ops.select_candidate_blocks_fused.op import select_candidate_blocks_fused


@dataclass
class Example:
    name: str
    shape: str
    run: Callable[[], object]  # the op on the example device
    expected: Callable[[], object]  # the reference on CPU copies
    ops: tuple[str, ...] = ()  # the ops it runs, where not just ``name``


def _on(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device) for t in tensors]


# On CPU tensors each op runs its reference, so `expected` calls the same wrapper on CPU copies.


def _moe_route(device: torch.device) -> Example:
    gen = torch.Generator().manual_seed(0)
    scores, bias = torch.rand(8, 896, generator=gen), torch.randn(896, generator=gen) * 0.1
    s, b = _on(device, scores, bias)
    return Example("moe_route", "T=8 E=896 topk=16", lambda: moe_route(s, b, 16, scale=2.5),
                   lambda: moe_route(scores, bias, 16, scale=2.5))


def _grouped_moe_route(device: torch.device) -> Example:
    gen = torch.Generator().manual_seed(1)
    scores = torch.sigmoid(torch.randn(8, 256, generator=gen)).bfloat16()
    bias = torch.randn(256, generator=gen) * 0.1
    s, b = _on(device, scores, bias)
    route = dict(scale=2.5, num_expert_group=8, topk_group=4)
    return Example("moe_route", "T=8 E=256 g8/4 k=8 bf16",
                   lambda: moe_route(s, b, 8, **route), lambda: moe_route(scores, bias, 8, **route))


def _moe_gate_route(device: torch.device) -> Example:
    """Hidden states and router weights on coarse grids (multiples of 1/4 and 1/64), so the
    logits are exact in fp32 in any summation order and every device routes alike."""
    gen = torch.Generator().manual_seed(2)
    hidden = ((torch.randn(4, 7168, generator=gen) * 4).round() / 4).bfloat16()  # T <= 4: the front on a GPU
    gate = ((torch.randn(896, 7168, generator=gen) * 1.28).round() / 64).bfloat16()
    bias = torch.randn(896, generator=gen) * 0.01
    h, g, b = _on(device, hidden, gate, bias)
    return Example("moe_gate_route", "T=4 H=7168 E=896 topk=16", lambda: moe_gate_route(h, g, b, 16, scale=2.5),
                   lambda: moe_gate_route(hidden, gate, bias, 16, scale=2.5))


def _select_candidate_blocks(device: torch.device) -> Example:
    logits = torch.randn(4, 32768, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([32768, 20000, 64, 0], dtype=torch.int32)
    x, e = _on(device, logits, lengths)
    return Example("select_candidate_blocks", "4x32K bs=64 k=256", lambda: select_candidate_blocks(x, e, 64, 256),
                   lambda: select_candidate_blocks(logits, lengths, 64, 256))


def _indexer_topk(device: torch.device) -> Example:
    scores = torch.randn(4, 65536, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    lengths = torch.tensor([65536, 40000, 2048, 5], dtype=torch.int32)
    x, n = _on(device, scores, lengths)
    return Example("indexer_topk", "4x64K bf16 k=2048", lambda: indexer_topk(x, n, 2048),
                   lambda: indexer_topk(scores, lengths, 2048))


def _mtp_indexer_topk(device: torch.device) -> Example:
    """An MTP step (next_n = 2): each request's two query rows, lengths from its KV length."""
    scores = torch.randn(6, 8192, generator=torch.Generator().manual_seed(6)).to(torch.float16)
    seq_lens = torch.tensor([8192, 3000, 40], dtype=torch.int32)
    x, n = _on(device, scores, seq_lens)
    return Example("indexer_topk (MTP rows)", "3x2 rows 8K fp16 k=512",
                   lambda: indexer_topk(x, decode_row_lengths(n, 2), 512),
                   lambda: indexer_topk(scores, decode_row_lengths(seq_lens, 2), 512),
                   ("indexer_topk", "decode_row_lengths"))


def _dcp_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(4, 4, 16384, generator=gen)
    lengths = torch.randint(0, 16385, (4, 4), generator=gen, dtype=torch.int32)
    return scores, lengths


def _dcp_generic(scores: torch.Tensor, lengths: torch.Tensor, topk: int) -> torch.Tensor:
    world_size = scores.shape[0]
    keys = torch.stack([dcp.local_topk_keys(scores[r], lengths[r], world_size, r, topk) for r in range(world_size)])
    return dcp.merge_generic(keys, 0)[0]


def _dcp(name: str, seed: int, path: Callable, other_path: Callable) -> Callable[[torch.device], Example]:
    """A W=4 group in one process on one merge path, checked against the other path on the CPU."""

    def build(device: torch.device) -> Example:
        scores, lengths = _dcp_inputs(seed)
        s, n = _on(device, scores, lengths)
        return Example(name, "W=4 T=4 L=16K K=2048", lambda: path(s, n, 2048),
                       lambda: other_path(scores, lengths, 2048), ("dcp_pack", "dcp_merge"))

    return build


_OWN_GROUP: list = []  # the process group the demo made, destroyed when the examples end


def _one_rank_group():
    """A one-rank process group (gloo for CPU tensors, NCCL for CUDA) for the full-step op."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        _OWN_GROUP.append(dist.group.WORLD)
    return dist.group.WORLD


def _release_group() -> None:
    """Destroy the group the demo made: a gloo group left to interpreter exit can abort the process
    ("terminate called without an active exception") while its threads are torn down."""
    import torch.distributed as dist

    while _OWN_GROUP:
        _OWN_GROUP.pop()
        if dist.is_initialized():
            dist.destroy_process_group()


def _dcp_step(device: torch.device) -> Example:
    """The full step as one op over a process group (here of one rank: the generic merge)."""
    scores, lengths = _dcp_inputs(5)
    s, n = _on(device, scores[0], lengths[0])
    group = _one_rank_group()
    return Example(
        "dcp_topk_merge (1 rank)", "T=4 L=16K K=2048", lambda: dcp.dcp_topk_merge(s, n, 2048, group)[0],
        lambda: _dcp_generic(scores[:1], lengths[:1], 2048), ("dcp_topk_merge",),
    )


def _indexer_topk_fused(device: torch.device) -> Example:
    """A paged KV cache: the KV slots through a shuffled page table, the positions and scores."""
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 16384, generator=gen)
    lengths = torch.tensor([16384, 5000, 100], dtype=torch.int32)
    page_table = torch.randperm(3 * 256, generator=gen).view(3, 256).to(torch.int32)  # pages of 64
    x, n, p = _on(device, scores, lengths, page_table)

    def run(s, e, t):
        return tuple(indexer_topk_fused(s, e, 1024, page_table=t, page_size=64, ids=True, values=True))

    return Example("indexer_topk_fused", "3x16K page 64 k=1024", lambda: run(x, n, p),
                   lambda: run(scores, lengths, page_table))


def _select_candidate_blocks_fused(device: torch.device) -> Example:
    """Block ids through a block table, and the raw block ids."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(2, 32768, generator=gen)
    lengths = torch.tensor([32768, 7000], dtype=torch.int32)
    table = torch.randperm(2 * 512, generator=gen).view(2, 512).to(torch.int32)
    x, n, t = _on(device, logits, lengths, table)
    return Example("select_candidate_blocks_fused", "2x32K bs=64 k=128",
                   lambda: tuple(select_candidate_blocks_fused(x, n, 64, 128, t, ids=True)[:2]),
                   lambda: tuple(select_candidate_blocks_fused(logits, lengths, 64, 128, table, ids=True)[:2]))


EXAMPLES = (
    _moe_route,
    _grouped_moe_route,
    _moe_gate_route,
    _select_candidate_blocks,
    _indexer_topk,
    _mtp_indexer_topk,
    _indexer_topk_fused,
    _select_candidate_blocks_fused,
    _dcp("dcp simulate (one-round)", 3, dcp.simulate_dcp_topk, _dcp_generic),
    _dcp("dcp generic merge", 4, _dcp_generic, dcp.simulate_dcp_topk),
    _dcp_step,
)


def _same(got: object, want: object) -> bool:
    if isinstance(want, tuple):
        return all(_same(g, w) for g, w in zip(got, want))
    got = got.cpu()
    if want.dtype.is_floating_point:
        return torch.allclose(got, want, rtol=1e-6, atol=0.0)
    return torch.equal(got, want)


def run_examples(device: torch.device, *, check: bool = False, repeats: int = 1) -> list[dict]:
    """Run every example on ``device``; returns one row per example (name, the ops it ran, shape,
    ms, ok: whether it matched the reference, None unchecked)."""
    rows = []
    try:
        for build in EXAMPLES:
            rows.append(_run_example(build(device), device, check, repeats))
    finally:
        _release_group()
    return rows


def _run_example(example: Example, device: torch.device, check: bool, repeats: int) -> dict:
    example.run()  # first call: compile / load
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        got = example.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = (time.perf_counter() - start) * 1e3 / repeats
    ok = _same(got, example.expected()) if check else None
    return {"op": example.name, "ops": example.ops or (example.name,), "shape": example.shape, "ms": ms, "ok": ok}
