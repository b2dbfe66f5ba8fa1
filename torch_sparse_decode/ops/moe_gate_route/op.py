"""``sparse_decode::moe_gate_route``: its argument check, its registration and its Python wrapper."""

from __future__ import annotations

import importlib

import torch

from ..._library import check_is_tensor, check_no_overlap, check_output, check_same_device, check_tensor, define_op
from ...limits import MOE_MAX_EXPERTS
from ..moe_route.op import check_moe_route, check_route_args
from . import reference

_HIDDEN = (torch.bfloat16,)


def check_moe_gate_route(hidden, gate_weight, bias, topk, renormalize, scale, num_expert_group, topk_group, weights,
                         ids, router_logits) -> None:
    check_tensor(hidden, "hidden", dtypes=_HIDDEN, ndim=2)
    check_tensor(gate_weight, "gate_weight", dtypes=_HIDDEN, ndim=2)
    tokens, width = hidden.shape
    experts = gate_weight.shape[0]
    if gate_weight.shape[1] != width:
        raise ValueError(f"gate_weight must have hidden's {width} columns, got shape {tuple(gate_weight.shape)}")
    if not 1 <= experts <= MOE_MAX_EXPERTS:
        raise ValueError(f"gate_weight must have 1 to {MOE_MAX_EXPERTS} experts (rows), got {experts}")
    check_output(router_logits, "router_logits", torch.float32, (tokens, experts), hidden, "hidden")
    check_same_device(hidden, "hidden", gate_weight=gate_weight)
    check_no_overlap({"weights": weights, "ids": ids, "router_logits": router_logits},
                     {"hidden": hidden, "gate_weight": gate_weight, "bias": bias})
    check_moe_route(router_logits, bias, topk, renormalize, scale, True, num_expert_group, topk_group, weights, ids)



define_op("moe_gate_route", ("weights", "ids", "router_logits"), check_moe_gate_route,
          cuda=f"{__package__}.kernel")(reference.moe_gate_route)


def moe_gate_route(
    hidden: torch.Tensor,
    gate_weight: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    *,
    renormalize: bool = True,
    scale: float = 1.0,
    num_expert_group: int = 1,
    topk_group: int = 1,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MoE router front: the router GEMM, its sigmoid and ``moe_route``, in one op.

    Args:
        hidden: bf16 [T, H] token hidden states, contiguous.
        gate_weight: bf16 [E, H] router weights, contiguous, E <= 1024.
        bias: fp32 [E] selection (correction) bias.
        topk, renormalize, scale, num_expert_group, topk_group: as ``moe_route``.
        out: optional (weights fp32 [T, topk], ids int32 [T, topk], router_logits fp32 [T, E]).

    Returns:
        ``(weights, ids, router_logits)``: ``router_logits`` is ``hidden @ gate_weight.T``
        accumulated in fp32 (within fp32 accumulation error of the exact product, in any
        order), and ``(weights, ids)`` are exactly ``moe_route(torch.sigmoid(router_logits),
        bias, ...)`` on the same device.
    """
    check_is_tensor(hidden, "hidden")
    check_is_tensor(gate_weight, "gate_weight")
    topk, num_expert_group, topk_group = check_route_args(topk, renormalize, scale, num_expert_group, topk_group)
    if out is None:
        tokens = hidden.shape[0] if hidden.dim() == 2 else 0
        experts = gate_weight.shape[0] if gate_weight.dim() == 2 else 0
        out = (
            torch.empty(tokens, topk, dtype=torch.float32, device=hidden.device),
            torch.empty(tokens, topk, dtype=torch.int32, device=hidden.device),
            torch.empty(tokens, experts, dtype=torch.float32, device=hidden.device),
        )
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError(f"out must be a (weights, ids, router_logits) triple of tensors, got {type(out).__name__} "
                        f"of {len(out) if isinstance(out, (tuple, list)) else 1}")
    weights, ids, router_logits = out
    torch.ops.sparse_decode.moe_gate_route(hidden, gate_weight, bias, topk, renormalize, float(scale),
                                           num_expert_group, topk_group, weights, ids, router_logits)
    return weights, ids, router_logits


def moe_gate_route_check(device: torch.device | str | None = None) -> None:
    """Raise ``RuntimeError`` if a router front launch on the CUDA ``device`` (default: the
    current one) ran out of time waiting for its score records since the last check. It reads a
    device word (a host sync): call it between steps, as a runner checks for NaNs. No-op without
    CUDA."""
    if torch.cuda.is_available():
        importlib.import_module(f"{__package__}.kernel").check(device)
