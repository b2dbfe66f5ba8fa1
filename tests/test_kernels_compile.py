"""Compile-only checks of the CuTe DSL kernels: they build from fake tensors without a GPU."""

import pytest

cute = pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")

from torch_sparse_decode.kernels import moe_route  # noqa: E402

MOE_CONFIGS = [(896, 16), (384, 8), (256, 8), (1024, 16), (160, 6), (8, 8), (1, 1), (17, 16)]


@pytest.mark.parametrize("experts,topk", MOE_CONFIGS)
def test_moe_route_compiles(experts, topk):
    for renormalize, apply_sigmoid in ((True, False), (False, True)):
        assert moe_route.compiled(experts, topk, renormalize, apply_sigmoid) is not None
