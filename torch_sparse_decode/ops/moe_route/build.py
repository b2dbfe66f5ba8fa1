"""What every routing kernel compiles the same way: the catalog's routings and the fake tensors
of a configuration (``kernel.py``, ``warps.py``)."""

from __future__ import annotations

import torch

import cutlass.cute as cute
from cutlass import Float32, Int32

from ...dtypes import WARM_SCORES, cute_type
from ...kernels import pdl
from ...kernels.compile import Target, fake_stream, fake_tensor


class Routing:
    """One static routing configuration, whichever kernel runs it: E, topk, renormalize,
    apply_sigmoid, the expert groups (count, kept); ``pdl``: launched as a programmatic dependent
    of the kernel before it (the router GEMM), so its launch and setup overlap that kernel's tail;
    it waits for it before reading the scores."""

    def __init__(self, experts: int, topk: int, renormalize: bool, apply_sigmoid: bool, groups: int = 1,
                 topk_group: int = 1, pdl: bool = False):
        self.pdl = pdl
        self.experts, self.topk = experts, topk
        self.renormalize, self.apply_sigmoid = renormalize, apply_sigmoid
        self.groups, self.topk_group = groups, topk_group
        self.group_size = experts // groups


def grouping(num_expert_group: int, topk_group: int) -> tuple[int, int]:
    """(groups, kept) as a kernel's configuration takes them: (1, 1) for ungrouped routing, so one
    build serves every ``topk_group`` a caller passes with it."""
    return (num_expert_group, topk_group) if num_expert_group > 1 else (1, 1)


def routings(target: Target) -> list[tuple]:
    """The routing of the models we serve (``Target.models``): scores after their sigmoid or
    router logits (``apply_sigmoid``), in fp32 or bf16; fp32 bias and weights."""
    configs = []
    for model in target.models:
        groups, kept = model.grouping
        for source in WARM_SCORES:
            for apply_sigmoid in (False, True):
                configs.append((model.experts, model.topk, model.renormalize, apply_sigmoid, groups, kept, source,
                                torch.float32, torch.float32, pdl.enabled(pdl.ROUTE)))
    return configs


def compile_route(kernel, experts: int, topk: int, source: torch.dtype, bias_dtype: torch.dtype,
                  weights_dtype: torch.dtype):
    """``kernel`` (called as ``(scores, bias, scale, weights, ids, stream)``) compiled from fake
    tensors (no GPU needed)."""
    tokens = cute.sym_int()
    scores = fake_tensor(cute_type(source), (tokens, experts), (experts, 1))
    bias = fake_tensor(cute_type(bias_dtype), (experts,), (1,))
    weights = fake_tensor(cute_type(weights_dtype), (tokens, topk), (topk, 1))
    ids = fake_tensor(Int32, (tokens, topk), (topk, 1))
    return cute.compile(kernel, scores, bias, Float32(1.0), weights, ids, fake_stream(), options="--enable-tvm-ffi")
