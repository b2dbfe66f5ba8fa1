"""Compile-only checks of the CuTe DSL kernels: they build from fake tensors without a GPU."""

import pytest
import torch

cute = pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")

from torch_sparse_decode.kernels import moe_route  # noqa: E402

topk = pytest.importorskip("torch_sparse_decode.kernels.topk", reason="triton not installed")

MOE_CONFIGS = [(896, 16), (384, 8), (256, 8), (1024, 16), (160, 6), (8, 8), (1, 1), (17, 16)]


@pytest.mark.parametrize("experts,topk", MOE_CONFIGS)
def test_moe_route_compiles(experts, topk):
    for renormalize, apply_sigmoid in ((True, False), (False, True)):
        assert moe_route.compiled(experts, topk, renormalize, apply_sigmoid) is not None


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int32])
def test_topk_engine_compiles(source, ranks):
    """Every configuration of the CuTe top-k engine (the op's k and sizes are runtime values):
    block keys with the pinned block, scores by their full bits, and scores by their bf16 ord16
    (the DCP pack)."""
    assert topk.compiled(source, source is torch.int32, ranks) is not None
    if source is not torch.int32:
        assert topk.compiled(source, False, ranks, ord16=True) is not None


def test_topk_engine_profile_build_compiles():
    """benchmarks/profile_topk.py's build, with the phase marks (not compiled into the op's)."""
    assert topk.compiled(torch.float32, False, 2, profile=True) is not None


@pytest.mark.parametrize("world_size,topk", [(2, 2048), (3, 100), (16, 64), (2, 4096), (16, 4096)])
def test_dcp_merge_compiles(world_size, topk):
    """The CuTe DCP merge, simulated and in a step, at the fewest and the most candidates per row."""
    from torch_sparse_decode.kernels import dcp_merge

    for exchange in (False, True):
        assert dcp_merge.compiled(world_size, topk, exchange) is not None


def test_triton_kernels_compile_for_sm90():
    """Every Triton kernel (block keys, DCP pack and merge) builds for SM90 at its decode shapes."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    script = os.path.join(os.path.dirname(__file__), "compile_triton_sm90.py")
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "compiled" in done.stdout.splitlines()[-1]


def test_cluster_size_keeps_every_row_in_one_wave():
    """Clusters of 4 and 8 fit the H200's 132 SMs about half as often as 132 / S (one CTA per SM)."""
    assert [topk.cluster_size(rows, 1 << 16, 132) for rows in (1, 8, 9, 16, 32, 64, 66, 67, 300)] == \
        [8, 8, 4, 4, 2, 2, 2, 1, 1]
    assert topk.cluster_size(1, 4096, 132) == 1 and topk.cluster_size(64, 1 << 14, 132) == 2


def test_engine_gated_copy_limits_cover_the_widest_rows():
    """The one-read path tags each copied id with its (tile, warp) part above ID_BITS and keeps
    MAX_TILES parts per warp: both must hold for the widest rows the ops accept (a span may
    start up to one 16-byte chunk before its first key)."""
    from torch_sparse_decode import ops

    assert ops.TOPK_MAX_WIDTH <= 1 << topk.ID_BITS
    assert -(-(ops.TOPK_MAX_WIDTH + 7) // topk.TILE) <= topk.MAX_TILES
    assert topk.MAX_TILES * topk.WARPS <= 1 << (32 - topk.ID_BITS)


def test_engine_shared_memory_fits_sm90():
    """The engine's shared memory (its allocations, from the module's constants) fits SM90's 227 KiB
    per block: the CPU compile does not check this, a launch would fail on the GPU."""
    words = 3 * topk.BINS + 3 * topk.THREADS + topk.FINE + 4 * topk.WARPS + topk.WARPS + 2 + 4 + 2 * topk.CAP
    words += 1 + topk.MAX_TILES * topk.WARPS  # the gated pass's claims and parts
    ring = topk.STAGES * topk.TILE * 4  # fp32 and int32 sources; bf16 takes half
    alignment = 12 * 16  # each of the 12 allocations may pad to 16 bytes
    assert 4 * words + ring + alignment <= 227 * 1024
