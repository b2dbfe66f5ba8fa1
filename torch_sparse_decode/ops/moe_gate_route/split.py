"""The router GEMM of a decode batch split over the whole GPU (Triton), for ``moe_gate_route``
batches the one-launch front does not take.

Why: the router's weights (896 x 7168 bf16: 12.8 MB) are read once a step, and a decode batch
has at most 64 tokens, so the GEMM is a read of the weights. cuBLAS takes 10-13 us for it at
T = 8..64 on the H200 (one read: 3.0 us): too few CTAs for so skinny a product. Here every CTA
owns BLOCK_E experts and one of SPLIT slices of the hidden dimension, so a launch has about two
CTAs per SM (``CTAS``), each reading 14-57 KB of weights; the batch, padded to BLOCK_T >= 16 rows, is the
M dimension of ``tl.dot`` (tensor cores, fp32 accumulation).

Each CTA stores its fp32 partial logits; the last of an expert tile's SPLIT CTAs to arrive (an
acq_rel counter, reset by that CTA, so CUDA graph replays find it zero) adds the partials in
split order and writes ``router_logits``: the logits are the same every run, and within fp32
accumulation error of the exact product (bf16 products are exact in fp32). ``moe_route`` then
routes them with its sigmoid (``kernel.py``), so ids and weights are bit for bit those of
``moe_route(torch.sigmoid(router_logits), ...)``.

Opt-in (``TORCH_SPARSE_DECODE_ROUTER_SPLIT=1``) until it has run on the GPU; its tiles and the
split are a plan to measure, not measured.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...kernels import pdl

SPLIT = os.environ.get("TORCH_SPARSE_DECODE_ROUTER_SPLIT", "0") == "1"
MAX_TOKENS = 64  # the largest batch the path takes (decode); larger ones stay on cuBLAS
MIN_BLOCK_T = 16  # tl.dot's smallest M
BLOCK_K = 64  # hidden columns a step of the K loop
CTAS = 256  # a launch's CTAs, about: two per SM of an H100 / H200 (132) or a B200 (148), whatever the GPU,
# so that a plan (and the build a CPU machine makes ahead of time) does not depend on the device
REDUCE_BYTES = 64 * 1024  # partials the last CTA of a tile reads at most (it adds them alone)
WARPS = 4
# K steps in flight (cp.async stages): about 20-40 KB of weights an SM in flight, which the HBM's
# latency needs for its bandwidth (2 CTAs an SM; 61 KB of shared memory a CTA at 64 tokens)
STAGES = 5


if pdl.INTERPRETED:  # the CPU interpreter's dot reads bf16 as raw bits

    @triton.jit
    def _dot(x, w, acc):
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
else:

    @triton.jit
    def _dot(x, w, acc):
        return tl.dot(x, tl.trans(w), acc)  # bf16 on the tensor cores, fp32 accumulation


class Plan(NamedTuple):
    """How a batch is split: rows a CTA multiplies (the batch padded), experts a CTA, slices of
    the hidden dimension and the columns of each (a multiple of BLOCK_K)."""

    block_t: int
    block_e: int
    split: int
    k_split: int

    def grid(self, experts: int) -> tuple[int, int]:
        return triton.cdiv(experts, self.block_e), self.split


def plan(tokens: int, experts: int, width: int) -> Plan:
    """About CTAS CTAs, unless the last CTA of a tile would read more than REDUCE_BYTES of
    partials: BLOCK_E = 32 at >= 512 experts (16 below, so that small routers still fill the GPU)."""
    block_t = max(MIN_BLOCK_T, triton.next_power_of_2(tokens))
    block_e = 32 if experts >= 512 else 16
    tiles = triton.cdiv(experts, block_e)
    split = max(1, min(triton.cdiv(CTAS, tiles), REDUCE_BYTES // (block_t * block_e * 4),
                       triton.cdiv(width, BLOCK_K)))
    k_split = triton.cdiv(triton.cdiv(width, split), BLOCK_K) * BLOCK_K
    return Plan(block_t, block_e, triton.cdiv(width, k_split), k_split)


@triton.jit(do_not_specialize=["tokens"])
def _router_split(hidden, gate, partials, logits, counters, tokens, WIDTH: tl.constexpr, EXPERTS: tl.constexpr,
                  SPLIT: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Program (tile, part): experts [tile * BLOCK_E, +BLOCK_E) over hidden columns
    [part * K_SPLIT, +K_SPLIT); the tile's last program to arrive sums the parts in order."""
    if PDL:  # a programmatic dependent of the kernel that writes the hidden states
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0)
    part = tl.program_id(1)
    t = tl.arange(0, BLOCK_T)
    e = tile * BLOCK_E + tl.arange(0, BLOCK_E)
    k = tl.arange(0, BLOCK_K)
    rows = t[:, None] < tokens
    experts = e[:, None] < EXPERTS
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    for at in range(part * K_SPLIT, part * K_SPLIT + K_SPLIT, BLOCK_K):
        cols = at + k[None, :]
        x = tl.load(hidden + t[:, None].to(tl.int64) * WIDTH + cols, mask=rows & (cols < WIDTH), other=0.0)
        w = tl.load(gate + e[:, None].to(tl.int64) * WIDTH + cols, mask=experts & (cols < WIDTH), other=0.0)
        acc = _dot(x, w, acc)  # bf16 products are exact in fp32
    at = t[:, None] * EXPERTS + e[None, :]
    live = rows & (e[None, :] < EXPERTS)
    size = tokens * EXPERTS
    tl.store(partials + part * size + at, acc, mask=live)
    tl.debug_barrier()  # every thread's partial is stored before the release below
    if tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
        total = tl.load(partials + at, mask=live, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            total += tl.load(partials + s * size + at, mask=live, other=0.0, cache_modifier=".cg")
        tl.store(logits + at, total, mask=live)
        tl.atomic_xchg(counters + tile, 0, sem="relaxed", scope="gpu")  # for the next launch


def takes(hidden: torch.Tensor, gate_weight: torch.Tensor) -> bool:
    """Whether a batch takes the split GEMM (``SPLIT`` on): 1..MAX_TOKENS tokens. A shape test,
    the same in every replay."""
    return SPLIT and 0 < hidden.shape[0] <= MAX_TOKENS


def counters(device: torch.device, experts: int) -> torch.Tensor:
    """Zeroed arrival counters, one per expert tile at the finest BLOCK_E (made by the op's
    workspace cache, outside any capture)."""
    return torch.zeros(triton.cdiv(experts, 16), dtype=torch.int32, device=device)


def router_logits(hidden: torch.Tensor, gate_weight: torch.Tensor, out: torch.Tensor, arrivals: torch.Tensor) -> None:
    """``out`` = ``hidden @ gate_weight.T`` in fp32 (contiguous bf16 inputs, 1..MAX_TOKENS rows)."""
    (tokens, width), experts = hidden.shape, gate_weight.shape[0]
    p = plan(tokens, experts, width)
    partials = torch.empty(p.split, tokens, experts, dtype=torch.float32, device=hidden.device)
    dependent = pdl.enabled(pdl.FRONT)
    _router_split[p.grid(experts)](
        hidden, gate_weight, partials, out, arrivals, tokens, WIDTH=width, EXPERTS=experts, SPLIT=p.split,
        K_SPLIT=p.k_split, BLOCK_T=p.block_t, BLOCK_E=p.block_e, BLOCK_K=BLOCK_K, PDL=dependent, num_warps=WARPS,
        num_stages=STAGES, launch_pdl=dependent,
    )


def warm(device: torch.device) -> None:
    """Compile (``kernels/triton_cache``) or load the GEMM of each model we serve at every batch
    padding (16, 32, 64 rows), where it is switched on."""
    if not SPLIT:
        return
    from ...kernels.compile import MODELS

    for model in MODELS:
        gate = torch.zeros(model.experts, model.hidden, dtype=torch.bfloat16, device=device)
        arrivals = counters(device, model.experts)
        for tokens in (16, 32, MAX_TOKENS):
            hidden = torch.zeros(tokens, model.hidden, dtype=torch.bfloat16, device=device)
            out = torch.empty(tokens, model.experts, device=device)
            router_logits(hidden, gate, out, arrivals)
