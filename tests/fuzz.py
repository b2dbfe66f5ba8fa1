"""Seeded GPU differential fuzzer: random mixed batches through every CUDA kernel, each case
compared bit for bit with the reference run on the same device.

    python -m pytest -m gpu tests/test_fuzz_gpu.py --fuzz-cases 5000 --fuzz-seed 1
    python tests/fuzz.py --seed 1 --cases 5000      # the same, as a script
    python tests/fuzz.py --seed 1 --case 17         # one case again: what a failure line prints

A case is one call of one op on a whole batch, because the engine's plan (cluster size, one-read
gate, rows kept unread, k_sel = 0) depends on the batch: rows of every length kind side by side
(the boundaries of k, of the cluster's spans and tiles, of the width; uniform; short), values
mixed from several families per batch (ties, few values, monotone rows, narrow rows, sparse
peaks, NaN / +-inf / +-0.0), tails past each row's end that would win if they were read, strided
and unaligned views, k from 1 to 4096, block sizes from 1 to 256. Ops: ``indexer_topk`` (fp32,
bf16, fp16), ``select_candidate_blocks`` (fp32, bf16, fp16 logits), the DCP pack (the engine's
ord16 select + the B' writer), the one-round DCP merge of simulated ranks (against the generic
merge), the generic local keys, and ``moe_route`` (grouped or not, fp32 / bf16 / fp16 scores).
Each case draws from ``random.Random(f"{seed}:{index}")`` and a CUDA generator seeded from it, so
a (seed, index) pair is its own reproducer. ``indexer_topk`` batches of at most 16K columns take
the one-CTA short-row path (unless TORCH_SPARSE_DECODE_SHORT_ROWS=0), and with its wide rows (on
unless TORCH_SPARSE_DECODE_SHORT_WIDE=0), batches of up to 128K whose clusters fit the SMs: widths
are drawn at its switches (16K, 32K, 64K and 128K, each +- 1) and lengths at the edges of its
threads' runs.

With TSD_FUZZ_OPT_IN=1 each case also draws the paths' switches (PDL, the short-row path, its
lean builds, their trim, clusters and wide rows, the warp routing, its groups in the warps, the split router GEMM,
the front's bulk staging and tensor-core GEMV: each on half the time) and restores them after: every path
checked on the same batches, a case's switches in its reproducer line (the seed and index, with
TSD_FUZZ_OPT_IN=1).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field

import torch

import torch_sparse_decode as tsd
from dcp_cases import canonical_rows
from inputs import same_bits
import oracle
from torch_sparse_decode import dcp
from torch_sparse_decode.ops.dcp import reference
from torch_sparse_decode.ops.moe_gate_route import front, kernel as gate_kernel
from torch_sparse_decode.ops.indexer_topk.reference import indexer_topk as indexer_reference
from torch_sparse_decode.ops.indexer_topk_fused.reference import indexer_topk_fused as indexer_fused_reference
from torch_sparse_decode.ops.moe_route.reference import moe_route as moe_route_reference
from torch_sparse_decode.ops.select_candidate_blocks.reference import select_candidate_blocks as blocks_reference
from torch_sparse_decode.ops.select_candidate_blocks_fused.reference import (
    select_candidate_blocks_fused as blocks_fused_reference,
)
from torch_sparse_decode.dtypes import ROUTER_SCORES, TOPK_SCORES

OPS = ("indexer_fp32", "indexer_bf16", "indexer_fp16", "blocks", "dcp_pack", "dcp_merge", "dcp_local_keys", "moe_route",
       "moe_gate_route")
WEIGHTS = (24, 10, 8, 28, 9, 7, 4, 12, 6)  # how often each op is drawn
FAMILIES = ("randn", "equal", "few", "ascending", "descending", "narrow", "peaks", "signed_zero", "inf", "nan",
            "relu", "bf16_plateau", "relu_sparse")
ELEMENTS = int(os.environ.get("TSD_FUZZ_ELEMENTS", 1 << 25))  # most scores one case draws (rows x width)
OPT_IN = os.environ.get("TSD_FUZZ_OPT_IN") == "1"  # each case draws the opt-in paths' switches
ALWAYS_BLOCKS = (1, 8, 16, 64, 256)
# (experts, topk, num_expert_group, topk_group)
ALWAYS_MOE = ((896, 16, 1, 1), (256, 8, 1, 1), (384, 8, 1, 1), (1024, 16, 1, 1), (17, 16, 1, 1), (1, 1, 1, 1),
              (256, 8, 8, 4), (160, 6, 8, 3), (512, 22, 1, 1), (1024, 32, 1, 1), (1024, 32, 32, 8), (64, 4, 32, 2),
              (512, 20, 32, 2))
ALWAYS_DCP = ((2, 2048), (2, 512), (4, 2048), (8, 1024), (16, 4096), (3, 100))
DEVICE = "cuda"  # the script's --device cpu dry-runs the generators (reference against itself)


@dataclass
class Case:
    seed: int
    index: int
    op: str = ""
    params: dict = field(default_factory=dict)

    def line(self) -> str:
        """The reproducer: what the case was and how to run it alone."""
        shown = " ".join(f"{k}={v}" for k, v in self.params.items())
        env = "TSD_FUZZ_OPT_IN=1 " if OPT_IN else ""
        return f"seed={self.seed} case={self.index} op={self.op} {shown} (rerun: {env}python tests/fuzz.py " \
               f"--seed {self.seed} --case {self.index})"


# ------------------------------------------------------------------------------ drawing


def palettes(seed: int):
    """Per-run choices that each cost a compile (block sizes, routing and DCP shapes): a few fixed
    ones and a few drawn from the seed, so runs with other seeds cover other values."""
    rng = random.Random(f"palette:{seed}")
    blocks = sorted(set(ALWAYS_BLOCKS) | {rng.randint(2, 255) for _ in range(6)})
    moe = list(ALWAYS_MOE)
    for _ in range(3):
        experts = rng.randint(1, 1024)
        moe.append((experts, rng.randint(1, min(32, experts)), 1, 1))
    for _ in range(2):  # grouped: groups of one expert up to 32 groups of 32
        groups = rng.choice([g for g in range(2, 33) if 1024 % g == 0 or g in (3, 6, 12)])
        experts = groups * rng.randint(1, 1024 // groups)
        kept = rng.randint(1, groups)
        moe.append((experts, rng.randint(1, min(32, kept * experts // groups)), groups, kept))
    shapes = list(ALWAYS_DCP)
    while len(shapes) < len(ALWAYS_DCP) + 2:
        world, topk = rng.randint(2, 16), rng.randint(1, 4096)
        if dcp.dcp_merge_local_topk(topk, world):
            shapes.append((world, topk))
    return blocks, moe, shapes


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def draw_k(rng: random.Random) -> int:
    r = rng.random()
    for bound, k in ((0.2, 2048), (0.3, 512), (0.4, 1024), (0.47, 4096), (0.55, 1)):
        if r < bound:
            return k
    return log_uniform(rng, 1, 4096)


def draw_width(rng: random.Random, cap: int) -> int:
    r = rng.random()
    if r < 0.05:  # at the short-row path's switches: one CTA or a cluster a row; 4 or 8 CTAs; the engine
        short = tsd_short_row()
        at = rng.choice([short.SHORT_MAX, 2 * short.SHORT_MAX, 4 * short.SHORT_MAX, short.WIDE_MAX])
        return min(cap, at + rng.choice([-1, 0, 1]))
    if r < 0.4:
        return log_uniform(rng, 1, min(cap, 20000))
    if r < 0.75:
        return rng.randint(min(cap, 20000), min(cap, 200000))
    return rng.randint(min(cap, 200000), cap)


def key_edges(rows: int, keys: int, k: int) -> list[int]:
    """Lengths (in keys) at the engine's boundaries for a batch of ``rows`` rows of ``keys`` keys:
    k's, the width's, and every span / tile / one-read / resident-ring edge of its cluster size."""
    ranks = tsd_engine().cluster_size(rows, keys, sms())
    e = tsd_engine()
    edges = [-1, 0, 1, k - 1, k, k + 1, k + 2, keys - 1, keys, keys + 17]
    edges += [m * t + d for t in (tsd_short_row().THREADS, 2048, 4096, 8192) for m in (1, 8, 16)
              for d in (-1, 0, 1)]  # the short path's runs: a CTA's, the wide rows' clusters
    for m in sorted({1, ranks}):
        for v in (e.TILE, e.ONE_READ_FROM, e.ONE_READ_FROM + e.TILE, e.STAGES * e.TILE, e.CAP, e.SPAN_PER_CTA, k):
            edges += [m * v - 1, m * v, m * v + 1]
    return edges


def draw_lengths(rng: random.Random, rows: int, keys: int, k: int, unit: int = 1) -> list[int]:
    """Per-row lengths in columns; ``unit`` columns per key (a block size): a key count u becomes a
    length that gives exactly u valid blocks."""
    edges = key_edges(rows, keys, k)
    mode = rng.random()
    lengths = []
    for _ in range(rows):
        r = rng.random()
        if mode < 0.15:  # one long row among short ones: the batch's width sets a large cluster
            u = keys if r < 0.1 else rng.randint(0, min(keys, 4 * k + 64))
        elif r < 0.5:
            u = rng.choice(edges)
        elif r < 0.85:
            u = rng.randint(0, keys)
        else:
            u = rng.randint(0, min(keys, 3 * k + 3))
        length = u * unit - (rng.randint(0, unit - 1) if u > 0 else 0)
        lengths.append(max(-1, min(length, keys * unit + 17)))
    return lengths


def values(rng: random.Random, gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """fp32 [rows, width] on the GPU, each row from one of 1-3 families drawn for the batch."""
    chosen = rng.sample(FAMILIES, rng.randint(1, 3))
    row_family = torch.tensor([rng.randrange(len(chosen)) for _ in range(rows)], device=DEVICE)
    out = torch.empty(rows, width, device=DEVICE)
    for f, name in enumerate(chosen):
        mask = (row_family == f)[:, None]
        out = torch.where(mask, family(name, gen, rows, width), out)
    return out


def family(name: str, gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    shape = (rows, width)
    x = torch.randn(shape, device=DEVICE, generator=gen)
    col = torch.arange(width, device=DEVICE, dtype=torch.float32).expand(shape)
    u = torch.rand(shape, device=DEVICE, generator=gen)
    if name == "equal":
        return torch.full(shape, 0.5, device=DEVICE)
    if name == "few":
        return torch.floor(u * 4) - 1.0
    if name == "ascending":
        return col.clone()
    if name == "descending":
        return width - col
    if name == "narrow":
        return 1 + 1e-6 * x
    if name == "peaks":
        return torch.where(u < 4096 / max(width, 1), 1 + u, torch.zeros_like(x))
    if name == "signed_zero":
        return torch.where(u < 0.45, -0.0, torch.where(u < 0.9, 0.0, x))
    if name == "inf":
        return torch.where(u < 0.1, math.inf, torch.where(u < 0.3, -math.inf, x))
    if name == "nan":
        return torch.where(u < 0.3, math.nan, x)
    if name == "relu":
        return torch.relu(x - 1)
    if name == "relu_sparse":  # ties at 0.0 and a few scattered keys above them
        return torch.relu(x - 3)
    if name == "bf16_plateau":
        return (x * 0.01).to(torch.bfloat16).float()
    return x


def with_tails(rng: random.Random, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Past each row's end: NaN, -inf, or values that would win if read (+inf, huge)."""
    tail = rng.choice([None, math.nan, -math.inf, math.inf, 3e38])
    if tail is None:
        return x
    col = torch.arange(x.shape[1], device=x.device)
    return torch.where(col[None, :] >= lengths.to(torch.int64)[:, None], tail, x)


def as_view(rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    """The same values, often in a row-strided or unaligned view (unit stride inside a row)."""
    rows, width = x.shape
    r = rng.random()
    if r < 0.2:
        off, extra = rng.randint(0, 3), rng.randint(1, 17)
        big = torch.full((rows, width + off + extra), math.nan, device=x.device, dtype=x.dtype)
        big[:, off:off + width] = x
        return big[:, off:off + width]
    if r < 0.3:
        big = torch.full((2 * rows, width), math.nan, device=x.device, dtype=x.dtype)
        big[::2] = x
        return big[::2]
    return x


# ------------------------------------------------------------------------------ running


def tsd_engine():
    from torch_sparse_decode.kernels import topk

    return topk


def tsd_short_row():
    from torch_sparse_decode.kernels.topk import short_row

    return short_row


def sms() -> int:
    if DEVICE != "cuda":
        return 132  # an H200's
    return tsd_engine().sm_count(torch.device("cuda", torch.cuda.current_device()))


def generator(rng: random.Random) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(rng.getrandbits(62))


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, -7, dtype=dtype, device=DEVICE)


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    rows = (got != want).reshape(got.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    if not rows:
        return ""
    r = rows[0]
    cols = (got[r] != want[r]).nonzero().flatten()[:4].tolist()
    return (f"{len(rows)} rows differ, first row {r}: at {cols} got {got[r].flatten()[cols].tolist()} "
            f"want {want[r].flatten()[cols].tolist()}")


def topk_case(case: Case, rng: random.Random, blocks: list[int]) -> str:
    op = case.op
    block = rng.choice(blocks) if op == "blocks" else 1
    k = draw_k(rng)
    width = draw_width(rng, 1 << 20)
    keys = -(-width // block)
    rows = max(1, min(log_uniform(rng, 1, 300), ELEMENTS // width))
    lengths = torch.tensor(draw_lengths(rng, rows, keys, k, block), dtype=torch.int32, device=DEVICE)
    lengths = lengths.clamp(max=width + 17)
    gen = generator(rng)
    x = with_tails(rng, values(rng, gen, rows, width), lengths)
    if op == "indexer_bf16":
        x = x.to(torch.bfloat16)
    elif op == "indexer_fp16":
        x = x.to(torch.float16)
    elif op == "blocks":
        x = x.to(rng.choice([torch.float32, *TOPK_SCORES]))  # fp32 twice as often
    x = as_view(rng, x)
    case.params.update(rows=rows, width=width, k=k, block=block, stride=x.stride(0),
                       ctas=tsd_engine().cluster_size(rows, keys, sms()))
    starts = draw_starts(rng, lengths) if rng.random() < 0.25 else None
    fused = rng.random() < 0.25  # the output stage's KV slots / block table, raw ids and values
    case.params.update(windows=starts is not None, fused=fused)
    if fused:
        return fused_case(rng, op, x, lengths, block, k, starts)
    got, want = poisoned((rows, k), torch.int32), poisoned((rows, k), torch.int32)
    if op == "blocks":
        tsd.select_candidate_blocks(x, lengths, block, k, row_starts=starts, out=got)
        blocks_reference(x, lengths, block, k, want, starts)
    else:
        tsd.indexer_topk(x, lengths, k, row_starts=starts, out=got)
        indexer_reference(x, lengths, k, want, starts)
    return first_difference(got, want)


def fused_case(rng: random.Random, op: str, x: torch.Tensor, lengths: torch.Tensor, block: int, k: int,
               starts: torch.Tensor | None) -> str:
    """The fused ops against their references: a random page (block) table, raw ids, values."""
    rows, width = x.shape
    page = 1 if op == "blocks" else rng.choice([1, 16, 64, 256])
    units = -(-width // (block if op == "blocks" else page)) + rng.randint(0, 3)
    table = torch.randint(0, (1 << 31) // page - 1, (rows, units), dtype=torch.int32, device=DEVICE)
    outs = [poisoned((rows, k), torch.int32) for _ in range(4)]
    if op == "blocks":
        torch.ops.sparse_decode.select_candidate_blocks_fused(x, lengths, block, k, outs[0], outs[1], table, starts)
        blocks_fused_reference(x, lengths, block, k, outs[2], outs[3], table, starts)
        return first_difference(outs[0], outs[2]) or first_difference(outs[1], outs[3])
    values = [poisoned((rows, k), x.dtype) for _ in range(2)]
    ids = rng.random() < 0.5
    torch.ops.sparse_decode.indexer_topk_fused(x, lengths, k, outs[0], outs[1] if ids else None, values[0], table,
                                               page, starts)
    indexer_fused_reference(x, lengths, k, outs[2], outs[3] if ids else None, values[1], table, page, starts)
    same_values = same_bits(values[0], values[1])
    return (first_difference(outs[0], outs[2]) or (ids and first_difference(outs[1], outs[3]))
            or ("" if same_values else "values differ"))


def draw_starts(rng: random.Random, lengths: torch.Tensor) -> torch.Tensor:
    """Window starts: 0, anywhere before the end (often unaligned), just before it, at it, past
    it, negative."""
    starts = []
    for end in lengths.tolist():
        mode = rng.random()
        if mode < 0.4:
            starts.append(rng.randint(0, max(end, 0)))
        elif mode < 0.55:
            starts.append(max(end - rng.randint(1, 3), 0))
        elif mode < 0.7:
            starts.append(end + rng.choice([0, 1, 1000]))
        elif mode < 0.8:
            starts.append(-rng.randint(1, 1 << 20))
        else:
            starts.append(rng.randint(0, 64))
    return torch.tensor(starts, dtype=torch.int32, device=lengths.device)


def dcp_case(case: Case, rng: random.Random, shapes: list[tuple[int, int]]) -> str:
    world, topk = rng.choice(shapes)
    simulated = case.op == "dcp_merge"
    length = draw_width(rng, 1 << 17)
    ranks = world if simulated else 1
    rows = max(1, min(log_uniform(rng, 1, 64 if simulated else 300), ELEMENTS // (length * ranks)))
    dtype = rng.choice([torch.float32, torch.bfloat16])
    gen = generator(rng)
    ranks = world if simulated else 1
    lengths = torch.tensor([draw_lengths(rng, rows, length, topk) for _ in range(ranks)], dtype=torch.int32,
                           device=DEVICE).clamp(max=length + 17)
    x = torch.stack([with_tails(rng, values(rng, gen, rows, length), lengths[r]) for r in range(ranks)]).to(dtype)
    if not simulated:
        x = as_view(rng, x[0])[None]
    rank = rng.randrange(world)
    case.params.update(world=world, topk=topk, rows=rows, length=length, dtype=str(dtype)[6:], rank=rank)
    if case.op == "dcp_pack":
        n = dcp.dcp_merge_local_topk(topk, world)
        packed, rescue = dcp.pack_candidates(x[0], lengths[0], world, rank, topk)
        want_p, want_r = torch.empty_like(packed), torch.empty_like(rescue)
        reference.dcp_pack(x[0], lengths[0], world, rank, topk, want_p, want_r)
        return (first_difference(canonical_rows(packed, n), canonical_rows(want_p, n))
                or first_difference(canonical_rows(rescue, dcp.rescue_row_slots(topk)),
                                    canonical_rows(want_r, dcp.rescue_row_slots(topk))))
    if case.op == "dcp_local_keys":
        got = dcp.local_topk_keys(x[0], lengths[0], world, rank, topk)
        want = torch.empty_like(got, device="cpu")
        reference.dcp_local_keys(x[0].cpu(), lengths[0].cpu(), world, rank, topk, want)
        return first_difference(got.cpu(), want)
    got_g, got_l, got_c = dcp.simulate_dcp_topk(x, lengths, topk, return_local=True)
    keys = torch.empty(world, rows, topk, dtype=torch.int64, device=DEVICE)
    for r in range(world):
        reference.dcp_local_keys(x[r], lengths[r], world, r, topk, keys[r])
    for r in range(world):
        want = [torch.empty(rows, topk, dtype=torch.int32, device=DEVICE) for _ in range(2)]
        want.append(torch.empty(rows, dtype=torch.int32, device=DEVICE))
        reference.dcp_merge_generic(keys, r, *want)
        for got, w in ((got_g, want[0]), (got_l[r], want[1]), (got_c[r], want[2])):
            diff = first_difference(got, w)
            if diff:
                return f"rank {r}: {diff}"
    return ""


def moe_case(case: Case, rng: random.Random, shapes: list[tuple[int, int, int, int]]) -> str:
    experts, topk, groups, kept = rng.choice(shapes)
    tokens = log_uniform(rng, 1, 8192)
    renormalize, apply_sigmoid = rng.random() < 0.7, rng.random() < 0.3
    scale = rng.choice([1.0, 2.5, 0.125, rng.uniform(0.1, 4)])
    gen = generator(rng)
    s = values(rng, gen, tokens, experts)
    if not apply_sigmoid and rng.random() < 0.6:
        s = torch.sigmoid(s)
    bias = rng.choice([torch.zeros(experts, device=DEVICE), 0.05 * torch.randn(experts, device=DEVICE, generator=gen),
                       family(rng.choice(FAMILIES), gen, 1, experts)[0]])
    dtype = rng.choice([torch.float32, *ROUTER_SCORES])
    s = s.to(dtype)
    weights_dtype = rng.choice([torch.float32, dtype])
    case.params.update(tokens=tokens, experts=experts, topk=topk, groups=groups, kept=kept, renormalize=renormalize,
                       sigmoid=apply_sigmoid, dtype=str(dtype).replace("torch.", ""),
                       weights=str(weights_dtype).replace("torch.", ""))
    got_w, got_i = poisoned((tokens, topk), weights_dtype), poisoned((tokens, topk), torch.int32)
    tsd.moe_route(s, bias, topk, renormalize=renormalize, scale=scale, apply_sigmoid=apply_sigmoid,
                  num_expert_group=groups, topk_group=kept, out=(got_w, got_i))
    want_w, want_i = torch.empty_like(got_w), torch.empty_like(got_i)
    moe_route_reference(s, bias, topk, renormalize, scale, apply_sigmoid, groups, kept, want_w, want_i)
    diff = first_difference(got_i, want_i)
    if diff:
        return "ids: " + diff
    diff = first_difference(got_w, want_w)  # bit-identical: the kernel follows the reference's arithmetic
    return "weights: " + diff if diff else ""


def gate_case(case: Case, rng: random.Random, shapes: list[tuple[int, int, int, int]]) -> str:
    """The router front (on a GPU: T <= the op's switch, half the cases up to the kernel's limit)
    and its GEMM path: ids and weights are moe_route's of the sigmoid of its own logits, bit for
    bit; the logits within the fp32 accumulation bound."""
    experts, topk, groups, kept = rng.choice(shapes)
    tokens, width = log_uniform(rng, 1, 40), rng.choice([256, 1024, 2056, 7168])
    gen = generator(rng)
    hidden = values(rng, gen, tokens, width).bfloat16()
    gate = (torch.randn(experts, width, device=DEVICE, generator=gen) * width ** -0.5).bfloat16()
    if rng.random() < 0.3:  # tied experts
        gate[1::2] = gate[0::2][: experts // 2]
    bias = rng.choice([torch.zeros(experts, device=DEVICE), 0.05 * torch.randn(experts, device=DEVICE, generator=gen)])
    renormalize, scale = rng.random() < 0.8, rng.choice([1.0, 2.5])
    case.params.update(tokens=tokens, width=width, experts=experts, topk=topk, groups=groups, kept=kept,
                       renormalize=renormalize)
    out = (poisoned((tokens, topk), torch.float32), poisoned((tokens, topk), torch.int32),
           poisoned((tokens, experts), torch.float32))
    # Half the cases run the front kernel past the op's switch, up to its own limit.
    front_tokens = front.MAX_TOKENS if rng.random() < 0.5 else gate_kernel.FRONT_TOKENS
    case.params.update(front_tokens=front_tokens)
    with gate_kernel.front_up_to(front_tokens):
        tsd.moe_gate_route(hidden, gate, bias, topk, renormalize=renormalize, scale=scale, num_expert_group=groups,
                           topk_group=kept, out=out)
    want_w, want_i = tsd.moe_route(torch.sigmoid(out[2]), bias, topk, renormalize=renormalize, scale=scale,
                                   num_expert_group=groups, topk_group=kept)
    exact = hidden.double() @ gate.double().T
    bound, magnitude = oracle.accumulation_bound(hidden, gate)
    inside = magnitude <= torch.finfo(torch.float32).max
    if not torch.all((out[2].double() - exact).abs()[inside] <= bound[inside]):
        return "router_logits outside the fp32 accumulation bound"
    return (("ids: " + d) if (d := first_difference(out[1], want_i)) else
            ("weights: " + d) if (d := first_difference(out[0].view(torch.int32), want_w.view(torch.int32))) else "")


def opt_in_switches():
    """(module, attribute, name) of each opt-in path's switch."""
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.ops.moe_gate_route import front, split
    from torch_sparse_decode.ops.moe_route import kernel as route_kernel, warps

    return ((pdl, "ON", "pdl"), (tsd_short_row(), "SHORT_ROWS", "short_rows"),
            (tsd_short_row(), "LEAN", "short_lean"), (tsd_short_row(), "TRIM", "short_trim"),
            (tsd_short_row(), "CLUSTER", "short_cluster"), (tsd_short_row(), "WIDE", "short_wide"),
            (tsd_short_row(), "PAIRS", "short_pairs"),
            (warps, "ON", "route_warps"), (route_kernel, "GROUP_WARPS", "route_group_warps"),
            (split, "SPLIT", "router_split"),
            (front, "BULK", "front_bulk"), (front, "MMA", "front_mma"))


def run_case(seed: int, index: int, palette=None) -> tuple[Case, str]:
    """(the case, '' when it matched the reference else what differed)."""
    blocks, moe, shapes = palette or palettes(seed)
    rng = random.Random(f"{seed}:{index}")
    case = Case(seed, index, rng.choices(OPS, WEIGHTS)[0])
    switches = opt_in_switches() if OPT_IN else ()
    saved = [getattr(module, attr) for module, attr, _ in switches]
    drawn = {name: rng.random() < 0.5 for name in dict.fromkeys(name for _, _, name in switches)}
    for module, attr, name in switches:
        setattr(module, attr, drawn[name])
    case.params.update(drawn)
    try:
        if case.op.startswith("indexer") or case.op == "blocks":
            diff = topk_case(case, rng, blocks)
        elif case.op.startswith("dcp"):
            diff = dcp_case(case, rng, shapes)
        elif case.op == "moe_gate_route":
            diff = gate_case(case, rng, moe)
        else:
            diff = moe_case(case, rng, moe)
    except Exception as err:  # an exception fails its case too, with its reproducer
        diff = f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        for (module, attr, _), value in zip(switches, saved):
            setattr(module, attr, value)
    return case, diff


def run(seed: int, cases: int, first: int = 0, log=print) -> list[str]:
    """Run cases ``first .. first + cases - 1``; returns one reproducer line per failure."""
    palette = palettes(seed)
    failures, counts = [], {}
    started = time.time()
    for index in range(first, first + cases):
        case, diff = run_case(seed, index, palette)
        counts[case.op] = counts.get(case.op, 0) + 1
        if diff:
            failures.append(f"FUZZ FAIL {case.line()}: {diff}")
            log(failures[-1])
        if "CUDA error" in diff:  # the context is lost: later cases cannot run
            log("fuzz: stopped after a CUDA error (raised by this case's kernels or, asynchronously, the case before)")
            break
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    log(f"fuzz seed={seed}: {cases} cases ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) in "
        f"{time.time() - started:.1f} s, {len(failures)} failed")
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--case", type=int, default=None, help="run this one case (a failure's reproducer)")
    p.add_argument("--device", default="cuda", help="cpu: dry-run the case generators")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if args.case is not None:
        case, diff = run_case(args.seed, args.case)
        print(case.line(), "->", diff or "matches the reference")
        return 1 if diff else 0
    return 1 if run(args.seed, args.cases) else 0


if __name__ == "__main__":
    sys.exit(main())
