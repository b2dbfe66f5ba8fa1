"""GPU kernels, one module per op, each registered as its op's CUDA implementation.

Modules are imported on first use, so ``import torch_sparse_decode`` needs neither CuTe DSL nor
Triton. Where a kernel's toolkit is missing on a CUDA machine, the op falls back to its
reference (exact, slow) and warns.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

import torch

from .. import reference
from .._library import register_kernel, register_warmup

# op name -> module in this package holding a function of the same name (its CUDA kernel).
# dcp_topk_merge takes the one-round step only on groups with a workspace (init_dcp_topk_merge).
CUDA_KERNELS = {
    "moe_route": "moe_route",
    "select_candidate_blocks": "topk",
    "indexer_topk": "topk",
    "dcp_pack": "dcp",
    "dcp_merge": "dcp",
    "dcp_topk_merge": "dcp",
}


def _load(module: str):
    try:
        return importlib.import_module(f"{__name__}.{module}")
    except ImportError as err:
        warnings.warn(f"torch_sparse_decode: {module} kernel unavailable ({err}); using the reference on CUDA")
        return None


def _lazy_kernel(name: str, module: str) -> Callable[..., None]:
    resolved: list[Callable[..., None]] = []

    def kernel(*args, **kwargs) -> None:
        if not resolved:
            loaded = _load(module)
            resolved.append(getattr(loaded, name) if loaded else getattr(reference, name))
        # Kernels launch on the current device's current stream: make that the inputs' device.
        with torch.cuda.device(args[0].device):
            resolved[0](*args, **kwargs)

    kernel.__name__ = name
    return kernel


for _name, _module in CUDA_KERNELS.items():
    register_kernel(_name, "cuda")(_lazy_kernel(_name, _module))


@register_warmup
def _compile_kernels(device: torch.device) -> None:
    """Compile each kernel's common configurations (the rest compile on first call)."""
    if device.type != "cuda":
        return
    for module in sorted(set(CUDA_KERNELS.values())):
        loaded = _load(module)
        if loaded is not None:
            loaded.warm(device)
