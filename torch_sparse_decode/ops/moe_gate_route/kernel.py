"""The CUDA path of ``moe_gate_route``: the router GEMM on cuBLAS (bf16 in, fp32 accumulation and
output, straight into ``router_logits``), then the ``moe_route`` kernel with its sigmoid (the
formula torch's CUDA sigmoid uses). Two launches, no host sync, CUDA-graph safe.

The routing reads only the op's own ``router_logits``, so ids and weights are bit-identical to
``moe_route(torch.sigmoid(router_logits), ...)`` on the device. The seed's one-launch front (GEMV
CTAs publishing score records to a mailbox that routing CTAs poll) is not built yet: this is the
path it is measured against, and the one that larger batches keep.
"""

from __future__ import annotations

import torch

from ..moe_route import kernel as route


def moe_gate_route(hidden, gate_weight, bias, topk, renormalize, scale, num_expert_group, topk_group, weights, ids,
                   router_logits) -> None:
    """The CUDA path of ``sparse_decode::moe_gate_route`` (arguments already checked)."""
    if hidden.shape[0] == 0:
        return
    torch.mm(hidden, gate_weight.t(), out_dtype=torch.float32, out=router_logits)
    route.moe_route(router_logits, bias, topk, renormalize, scale, True, num_expert_group, topk_group, weights, ids)


# The routing configurations warmup() compiles: Kimi K3 (896 experts, top 16) and DeepSeek-V3
# (256 experts, 8 groups of which 4 kept, top 8), both with the sigmoid.
WARM_CONFIGS = [(896, 16, True, True, 1, 1), (256, 8, True, True, 8, 4)]


def warm(device: torch.device) -> None:
    for config in WARM_CONFIGS:
        route.compiled(*config)
