"""One small, realistic example per op: used by the demo (``python -m torch_sparse_decode``) and
by ``warmup()``. Each example runs the op on a device and can check it against the reference run
on CPU copies of the same inputs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import dcp, reference
from .api import indexer_topk, moe_route, select_candidate_blocks


@dataclass
class Example:
    name: str
    shape: str
    run: Callable[[], object]  # the op on the example device
    expected: Callable[[], object]  # the reference on CPU copies


def _moe_route(device: torch.device) -> Example:
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(8, 896, generator=gen)
    bias = torch.randn(896, generator=gen) * 0.1

    def expected():
        weights, ids = torch.empty(8, 16), torch.empty(8, 16, dtype=torch.int32)
        reference.moe_route(scores, bias, 16, True, 2.5, False, weights, ids)
        return weights, ids

    s, b = scores.to(device), bias.to(device)
    return Example("moe_route", "T=8 E=896 topk=16", lambda: moe_route(s, b, 16, scale=2.5), expected)


def _select_candidate_blocks(device: torch.device) -> Example:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 32768, generator=gen)
    row_ends = torch.tensor([32768, 20000, 64, 0], dtype=torch.int32)

    def expected():
        out = torch.empty(4, 256, dtype=torch.int32)
        reference.select_candidate_blocks(logits, row_ends, 64, out)
        return out

    x, e = logits.to(device), row_ends.to(device)
    return Example(
        "select_candidate_blocks", "4x32K bs=64 k=256", lambda: select_candidate_blocks(x, e, 64, 256), expected
    )


def _indexer_topk(device: torch.device) -> Example:
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(4, 65536, generator=gen).to(torch.bfloat16)
    lengths = torch.tensor([65536, 40000, 2048, 5], dtype=torch.int32)

    def expected():
        out = torch.empty(4, 2048, dtype=torch.int32)
        reference.indexer_topk(scores, lengths, 2048, out)
        return out

    x, n = scores.to(device), lengths.to(device)
    return Example("indexer_topk", "4x64K bf16 k=2048", lambda: indexer_topk(x, n, 2048), expected)


def _dcp_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(4, 4, 16384, generator=gen)
    lengths = torch.randint(0, 16385, (4, 4), generator=gen, dtype=torch.int32)
    return scores, lengths


def _dcp_simulated(device: torch.device) -> Example:
    scores, lengths = _dcp_inputs(3)
    s, n = scores.to(device), lengths.to(device)
    return Example(
        "dcp simulate (one-round)",
        "W=4 T=4 L=16K K=2048",
        lambda: dcp.simulate_dcp_topk(s, n, 2048),
        lambda: _dcp_generic(scores, lengths, 2048),
    )


def _dcp_generic(scores: torch.Tensor, lengths: torch.Tensor, topk: int) -> torch.Tensor:
    world_size = scores.shape[0]
    keys = torch.stack([dcp.local_topk_keys(scores[r], lengths[r], world_size, r, topk) for r in range(world_size)])
    return dcp.merge_generic(keys, 0)[0]


def _dcp_generic_example(device: torch.device) -> Example:
    scores, lengths = _dcp_inputs(4)
    s, n = scores.to(device), lengths.to(device)
    return Example(
        "dcp generic merge",
        "W=4 T=4 L=16K K=2048",
        lambda: _dcp_generic(s, n, 2048),
        lambda: dcp.simulate_dcp_topk(scores, lengths, 2048),
    )


EXAMPLES = (_moe_route, _select_candidate_blocks, _indexer_topk, _dcp_simulated, _dcp_generic_example)


def _same(got: object, want: object) -> bool:
    if isinstance(want, tuple):
        return all(_same(g, w) for g, w in zip(got, want))
    got = got.cpu()
    if want.dtype.is_floating_point:
        return torch.allclose(got, want, rtol=1e-6, atol=0.0)
    return torch.equal(got, want)


def run_examples(device: torch.device, *, check: bool = False, repeats: int = 1) -> list[dict]:
    """Run every example on ``device``; returns one row per op (name, shape, ms, ok)."""
    rows = []
    for build in EXAMPLES:
        example = build(device)
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
        rows.append({"op": example.name, "shape": example.shape, "ms": ms, "ok": ok})
    return rows
