"""The CUDA path of ``moe_gate_route``.

- Decode batches (T <= ``FRONT_TOKENS``, and no more tokens than the front's CTAs): the
  one-launch front of ``front.py``, the router GEMV publishing score records to a mailbox that
  the routing CTAs poll. The kernel takes up to ``front.MAX_TOKENS``; the switch is measured
  (H200: the front beats the GEMM path at T <= 4, 1.2-1.6x, and loses from T = 8 at 896
  experts, where its CUDA-core FMAs take a second chunk of hidden vectors).
- Larger batches: the router GEMM on cuBLAS (bf16 in, fp32 accumulation and output, straight into
  ``router_logits``), then the ``moe_route`` kernel with its sigmoid. Two launches. Opt-in
  (``split.SPLIT``), batches of up to ``split.MAX_TOKENS`` take the GEMM split over the whole GPU
  (``split.py``) instead of cuBLAS.

Both route the op's own ``router_logits`` with ``moe_route``'s arithmetic, so ids and weights
are bit-identical to ``moe_route(torch.sigmoid(router_logits), ...)`` on the device. No host
sync, CUDA-graph safe; the front's mailbox and the split GEMM's counters are allocated by ``warm``
(``warmup()``) or the first call outside a capture, one per device and expert count.
"""

from __future__ import annotations

import contextlib

import torch

from ...kernels import pdl
from ...kernels.compile import MODELS
from ...kernels.topk import sm_count
from ..moe_route import kernel as route
from ..moe_route.build import grouping
from . import front, split

TIMEOUT_NS = 2_000_000_000  # a consumer's bound on waiting for the records (the error word after it)
FRONT_TOKENS = 4  # the largest batch the op sends to the front (measured; at most front.MAX_TOKENS)
_WORKSPACES: dict[tuple, object] = {}  # (maker, device, experts) -> the maker's workspace


def workspace(make, device: torch.device, experts: int):
    """``make(device, experts)`` (the front's mailbox, the split GEMM's counters), made on first use,
    never inside a CUDA graph capture (a capture would own it)."""
    key = (make, device, experts)
    if key not in _WORKSPACES:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_gate_route: call torch_sparse_decode.warmup() (or the op once) before capturing "
                               f"a CUDA graph: the router's workspace for {experts} experts is not allocated yet")
        _WORKSPACES[key] = make(device, experts)
    return _WORKSPACES[key]


@contextlib.contextmanager
def front_up_to(tokens: int):
    """Within it, the op sends the front batches of up to ``tokens`` (tests and benchmarks run the
    kernel past the measured switch, up to ``front.MAX_TOKENS``)."""
    global FRONT_TOKENS
    switch, FRONT_TOKENS = FRONT_TOKENS, tokens
    try:
        yield
    finally:
        FRONT_TOKENS = switch


def uses_front(hidden: torch.Tensor, gate_weight: torch.Tensor) -> bool:
    """Whether the front takes the batch: at most FRONT_TOKENS tokens, no more than its CTAs, rows
    it can read as 16-byte vectors, and the CTA's weight rows in shared memory (host metadata)."""
    (tokens, width), experts = hidden.shape, gate_weight.shape[0]
    ctas = front.ctas_for(experts, sm_count(hidden.device))
    return (0 < tokens <= min(FRONT_TOKENS, front.MAX_TOKENS, ctas) and front.fits(experts, width, ctas, front.MMA)
            and hidden.data_ptr() % 16 == 0 and gate_weight.data_ptr() % 16 == 0)


def moe_gate_route(hidden, gate_weight, bias, topk, renormalize, scale, num_expert_group, topk_group, weights, ids,
                   router_logits, *, timeout_ns: int = TIMEOUT_NS, skip: int = -1) -> None:
    """The CUDA path of ``sparse_decode::moe_gate_route`` (arguments already checked). ``skip``
    (tests only): an expert whose records the front never publishes."""
    tokens, width = hidden.shape
    experts = gate_weight.shape[0]
    if tokens == 0:
        return
    groups, kept = grouping(num_expert_group, topk_group)
    if uses_front(hidden, gate_weight):
        box = workspace(front.workspace, hidden.device, experts)
        ctas = front.ctas_for(experts, sm_count(hidden.device))
        build = front.compiled(experts, width, topk, renormalize, groups, kept, ctas,
                               front.chunk_for(tokens, front.MMA), pdl.enabled(pdl.FRONT), *front.switches())
        build(hidden.view(torch.int32), gate_weight.view(torch.int32), bias, scale, weights, ids, router_logits,
            box.words, box.state, timeout_ns, skip)
        return
    if split.takes(hidden, gate_weight):
        arrivals = workspace(split.counters, hidden.device, experts)
        split.router_logits(hidden, gate_weight, router_logits, arrivals)
    else:
        torch.mm(hidden, gate_weight.t(), out_dtype=torch.float32, out=router_logits)
    route.moe_route(router_logits, bias, topk, renormalize, scale, True, num_expert_group, topk_group, weights, ids)


def check(device: torch.device | None = None) -> None:
    """Raise if a front launch on ``device`` timed out waiting for its records (a host sync: call
    it between steps, not inside a capture). The mailbox may then hold stale records: it is made
    anew."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    for (make, where, experts), box in list(_WORKSPACES.items()):
        if make is front.workspace and where == device and int(box.state[2].item()) != 0:
            del _WORKSPACES[(make, where, experts)]
            raise RuntimeError(f"moe_gate_route: a router front launch on {device} ({experts} experts) timed out "
                               "waiting for its score records; its outputs were not valid")


def warm_triton(device: torch.device) -> None:
    """The split GEMM's Triton builds, where it is switched on (``kernels/triton_cache``)."""
    split.warm(device)


def warm(device: torch.device) -> None:
    """The front's mailbox of each model we serve (its kernels are in the catalogs), and the split
    GEMM's counters where it is switched on."""
    for model in MODELS:
        workspace(front.workspace, device, model.experts)
        if split.SPLIT:
            workspace(split.counters, device, model.experts)
