"""The exact pure-torch reference of ``moe_gate_route``: its CPU kernel and the tests' subject."""

from __future__ import annotations

import torch

from ..moe_route.reference import moe_route


def moe_gate_route(
    hidden: torch.Tensor,
    gate_weight: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    renormalize: bool,
    scale: float,
    num_expert_group: int,
    topk_group: int,
    weights: torch.Tensor,
    ids: torch.Tensor,
    router_logits: torch.Tensor,
) -> None:
    """The router GEMM in fp32 (``hidden.float() @ gate_weight.float().T``, to ``router_logits``),
    then ``moe_route`` of its sigmoid: the routing is a function of the op's own logits."""
    torch.matmul(hidden.float(), gate_weight.float().T, out=router_logits)
    moe_route(router_logits, bias, topk, renormalize, scale, True, num_expert_group, topk_group, weights, ids)
