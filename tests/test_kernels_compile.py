"""Compile-only checks of the CuTe DSL kernels: they build from fake tensors without a GPU."""

import functools
import os
import re
import subprocess
import sys

import pytest
import torch

cute = pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")

from torch_sparse_decode.ops.moe_route import kernel as moe_route  # noqa: E402

pytest.importorskip("triton", reason="triton not installed")
from torch_sparse_decode.kernels import topk  # noqa: E402
from torch_sparse_decode.dtypes import ROUTER_SCORES  # noqa: E402

MOE_CONFIGS = [(896, 16), (384, 8), (256, 8), (1024, 16), (160, 6), (8, 8), (1, 1), (17, 16)]


@pytest.mark.parametrize("experts,topk", MOE_CONFIGS)
def test_moe_route_compiles(experts, topk):
    for renormalize, apply_sigmoid in ((True, False), (False, True)):
        assert moe_route.compiled(experts, topk, renormalize, apply_sigmoid) is not None


@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (160, 6, 8, 3), (1024, 32, 32, 32),
                                                      (64, 1, 32, 1), (512, 22, 1, 1), (1024, 32, 1, 1), (8, 2, 8, 2)])
@pytest.mark.parametrize("source", ROUTER_SCORES)
def test_moe_route_compiles_grouped_and_in_every_dtype(experts, topk, groups, kept, source):
    """Grouped routing, topk up to 32 of up to 1024 experts, groups of one, and bf16 / fp16 scores
    with weights and bias in the scores' dtype or fp32."""
    assert moe_route.compiled(experts, topk, True, source != torch.float32, groups, kept, source, torch.float32,
                              source) is not None
    if source != torch.float32:
        assert moe_route.compiled(experts, topk, False, False, groups, kept, source, source, torch.float32) is not None


def test_topk_engine_profile_build_compiles():
    """benchmarks/profile_topk.py's build, with the phase marks (not compiled into the op's)."""
    assert topk.compiled(torch.float32, False, 2, profile=True) is not None


@pytest.mark.parametrize("world_size,topk", [(2, 2048), (3, 100), (16, 64), (2, 4096), (16, 4096)])
def test_dcp_merge_compiles(world_size, topk):
    """The CuTe DCP merge, simulated and in a step, at the fewest and the most candidates per row."""
    from torch_sparse_decode.ops.dcp import merge as dcp_merge

    for exchange in (False, True):
        assert dcp_merge.compiled(world_size, topk, exchange) is not None


def test_dcp_merge_shared_memory_as_compiled_fits_sm90():
    """The merge's shared memory (the same at every W and K: the bitmaps of one 2**17-id chunk and
    the K ids), as compiled, fits SM90."""
    from torch_sparse_decode.ops.dcp import merge as dcp_merge

    assert compiled_smem_bytes(dcp_merge.compiled, 16, 4096, True) <= SM90_SMEM


def _small_route_kernel(built: list):
    from torch_sparse_decode.kernels.compile import cached_kernel, fake_stream, fake_tensor

    @cached_kernel("cache_test")
    def compiled(experts: int, topk: int = 8):
        built.append(experts)
        tokens = cute.sym_int()
        kernel = moe_route.MoeRoute(experts, topk, True, False)
        return cute.compile(kernel, fake_tensor(cute.Float32, (tokens, experts), (experts, 1)),
                            fake_tensor(cute.Float32, (experts,), (1,)), cute.Float32(1.0),
                            fake_tensor(cute.Float32, (tokens, topk), (topk, 1)),
                            fake_tensor(cute.Int32, (tokens, topk), (topk, 1)), fake_stream(),
                            options="--enable-tvm-ffi")

    return compiled


def test_a_new_process_loads_compiled_kernels_from_the_disk_cache(tmp_path, monkeypatch):
    """The first compile writes an object file; with the process's cache emptied, the same kernel
    at the same configuration (however its arguments are spelled) loads from it and is not
    compiled again. Another configuration compiles."""
    from torch_sparse_decode.kernels import compile as helper

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    built = []
    compiled = _small_route_kernel(built)
    first = compiled(64)
    assert first is not None and built == [64]
    assert [p.suffix for p in tmp_path.iterdir()] == [".o"]
    assert compiled(64) is first and built == [64]  # the process's cache

    helper.clear_memory()  # as a new process
    loaded = compiled(64, topk=8)
    assert loaded is not None and loaded is not first and built == [64]
    compiled(32)
    assert built == [64, 32] and len(list(tmp_path.iterdir())) == 2


def test_the_disk_cache_is_off_at_0_and_survives_a_bad_file(tmp_path, monkeypatch):
    from torch_sparse_decode.kernels import compile as helper

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", "0")
    assert helper.cache_dir() is None
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    built = []
    compiled = _small_route_kernel(built)
    path, _ = compiled.entry(compiled.config(16))
    path.write_bytes(b"not an object file")
    assert compiled(16) is not None and built == [16]  # compiled anew, and the file replaced
    helper.clear_memory()
    compiled(16)
    assert built == [16]


def test_an_object_under_another_entrys_name_is_not_loaded(tmp_path, monkeypatch):
    """A foreign object (another configuration's, copied or renamed to this entry's file) lacks
    the entry's symbol: it is not loaded, the kernel compiles anew and replaces it."""
    from torch_sparse_decode.kernels import compile as helper

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    built = []
    compiled = _small_route_kernel(built)
    compiled(16)
    (theirs, _), (mine, _) = compiled.entry(compiled.config(16)), compiled.entry(compiled.config(32))
    mine.write_bytes(theirs.read_bytes())
    helper.clear_memory()
    compiled(32)
    assert built == [16, 32] and mine.read_bytes() != theirs.read_bytes()


def test_a_kernel_built_outside_the_package_is_keyed_by_its_own_file(tmp_path, monkeypatch):
    """A benchmark's copy of a kernel file must not load the package's build of the same name:
    its entry is keyed by the copy's bytes, and an edit to the copy gives a new entry."""
    import importlib.util

    from torch_sparse_decode.kernels import compile as helper

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path / "cache"))

    def load(text: str, name: str):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"torch_sparse_decode.kernels.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return helper.CachedKernel("topk_engine", module.build, lambda target: ())

    first = load("from . import cute\ndef build(n):\n    return n\n", "copy_a")
    edited = load("from . import cute\ndef build(n):\n    return n + 0\n", "copy_b")
    copy = (tmp_path / "copy_a.py").resolve()
    assert set(helper.source_files(first.build.__module__, copy)) == {copy, helper._PACKAGE / "kernels" / "cute.py"}
    keys = {kernel.entry((1,)) for kernel in (first, edited, topk.compiled)}
    assert len(keys) == 3


@pytest.mark.gpu
def test_kernels_from_the_disk_cache_give_the_same_answers(tmp_path, monkeypatch):
    """Every op's answers from kernels loaded off the disk cache equal those of freshly compiled
    ones, on poisoned outputs (the routing kernel, the engine at 1 and 8 CTAs a row, fp32 and bf16,
    block keys, and the DCP merge)."""
    import torch_sparse_decode as tsd
    from torch_sparse_decode import dcp
    from torch_sparse_decode.kernels import compile as helper

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(33, 896, generator=gen).cuda()
    bias = torch.randn(896, generator=gen).cuda()
    wide = torch.randn(2, 1 << 17, generator=gen).cuda()
    ends = torch.tensor([1 << 17, 70001], dtype=torch.int32, device="cuda")
    local = torch.randn(2, 3, 8192, generator=gen).cuda()
    local_lengths = torch.full((2, 3), 8192, dtype=torch.int32, device="cuda")

    def run():
        weights = torch.full((33, 16), float("nan"), device="cuda")
        ids = torch.full((33, 16), -7, dtype=torch.int32, device="cuda")
        tsd.moe_route(scores, bias, 16, scale=2.5, out=(weights, ids))
        outs = [weights, ids]
        for x in (wide, wide.bfloat16(), wide[:1, :5000]):
            outs.append(tsd.indexer_topk(x, ends[:x.shape[0]], 2048,
                                         out=torch.full((x.shape[0], 2048), -7, dtype=torch.int32, device="cuda")))
        outs.append(tsd.select_candidate_blocks(wide, ends, 8, 1024,
                                                out=torch.full((2, 1024), -7, dtype=torch.int32, device="cuda")))
        outs.extend(dcp.simulate_dcp_topk(local, local_lengths, 2048))
        torch.cuda.synchronize()
        return outs

    helper.clear_memory()
    fresh = run()
    assert any(tmp_path.iterdir())
    helper.clear_memory()
    monkeypatch.setattr(cute, "compile", lambda *a, **k: pytest.fail("compiled instead of loading"))
    loaded = run()
    for a, b in zip(fresh, loaded):
        assert torch.equal(a, b)


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
    from torch_sparse_decode import limits as ops

    assert ops.TOPK_MAX_WIDTH <= 1 << topk.ID_BITS
    assert -(-(ops.TOPK_MAX_WIDTH + 7) // topk.TILE) <= topk.MAX_TILES
    assert topk.MAX_TILES * topk.WARPS <= 1 << (32 - topk.ID_BITS)


SM90_SMEM = 227 * 1024  # shared memory one block may take on SM90
SM90_SM_SMEM = 228 * 1024  # an SM's, shared by its blocks


def compiled_smem_bytes(kernel, *config, **named) -> int:
    """The shared memory a configuration allocates, as compiled: the sum of the kernel's shared
    allocations (each aligned) in the IR the DSL hands its compiler. (The CPU compile does not
    check it against the GPU's limit; a launch would fail there.)"""
    text = _compiled_text("ir", kernel, *config, **named)
    types = {name: (int(align), int(size)) for name, align, size in re.findall(
        r'^(!memref_smem_i8[_0-9]*) = !cute\.memref<i8, smem, align<(\d+)>, "(\d+):1">', text, re.M)}
    total = 0
    for name in re.findall(r"cute\.memref\.alloca\(\) \{smem\.partition_id = \d+ : i32\} : (!memref_smem_i8[_0-9]*)\b",
                           text):
        align, size = types[name]
        total = -(-total // align) * align + size
    assert total > 0, "no shared allocation found in the IR (has the DSL's IR changed?)"
    return total


@pytest.mark.parametrize("source", list(topk.SOURCES))
def test_engine_shared_memory_as_compiled_fits_sm90(source):
    """The engine's shared memory as compiled is what ``smem_bytes`` (the one table the kernel
    allocates from, ``layout.shared_arrays``) says, and fits SM90: an array allocated outside the
    table fails here."""
    got = compiled_smem_bytes(topk.compiled, source, False, 1)
    assert got == topk.smem_bytes(topk.SOURCES[source]) <= SM90_SMEM


def test_a_configuration_compiles_once_however_its_arguments_are_spelled(tmp_path, monkeypatch):
    """warmup() and the op may name the same configuration differently (a default left out or
    passed): it must not compile twice, or the op's first call would compile after warmup."""
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", "0")
    built = []
    compiled = _small_route_kernel(built)
    first = compiled(48)
    assert compiled(48, 8) is first and compiled(48, topk=8) is first and compiled(experts=48) is first
    assert built == [48]


_SPILL_BUILDS = (("float32", 8, False), ("bfloat16", 2, False), ("int32", 1, False), ("float32", 8, True))


@functools.lru_cache(maxsize=None)
def _engine_spills() -> dict:
    """ptxas's spill stores (bytes) for each of _SPILL_BUILDS, compiled for SM90 in a fresh
    process (the DSL reads its diagnostics option from the environment)."""
    code = (
        "import torch\n"
        "from torch_sparse_decode.kernels import topk as t\n"
        f"for source, ctas, fused in {_SPILL_BUILDS!r}:\n"
        "    t.compiled(getattr(torch, source), source == 'int32', ctas, fused=fused)\n"
    )
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_COMPILER_OPT="remarks{ptx}", TORCH_SPARSE_DECODE_CACHE="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stdout + done.stderr)]
    assert len(spills) == len(_SPILL_BUILDS), (spills, done.stderr[-3000:])
    return dict(zip(_SPILL_BUILDS, spills))


def test_plain_engine_builds_do_not_spill():
    """The engine's plain builds fit 128 registers a thread (512 threads, one CTA an SM) with no
    spills: a spill in the streaming passes would cost every row."""
    spills = {build: n for build, n in _engine_spills().items() if not build[2]}
    assert not any(spills.values()), spills


def test_fused_engine_build_does_not_spill():
    assert _engine_spills()[("float32", 8, True)] == 0


@pytest.mark.parametrize("experts,width,topk_,groups,kept", [(896, 7168, 16, 1, 1), (256, 7168, 8, 8, 4),
                                                             (1024, 4096, 32, 1, 1), (64, 256, 4, 8, 4),
                                                             (17, 2056, 3, 1, 1)])
def test_router_front_compiles(experts, width, topk_, groups, kept):
    """The one-launch router front at the model shapes and odd ones (E not a multiple of the
    CTAs, H not a multiple of 256), with and without renormalization, staging by cp.async and by
    bulk copies (the last slice of a row as short as one vector), on the CUDA cores and, where
    rows are whole 32-column blocks, on the tensor cores (one and two MMAs' tokens)."""
    from torch_sparse_decode.ops.moe_gate_route import front

    ctas = front.ctas_for(experts, 132)
    for renormalize, chunk, bulk in ((True, 1, False), (False, 2, False), (True, 4, False), (True, 1, True)):
        assert front.compiled(experts, width, topk_, renormalize, groups, kept, ctas, chunk, bulk=bulk)
    assert front.fits(experts, width, ctas, mma=True) == (width % 32 == 0)
    if width % 32 == 0:
        for renormalize, chunk in ((True, 8), (False, 16)):
            assert front.compiled(experts, width, topk_, renormalize, groups, kept, ctas, chunk, mma=True)


def test_router_front_shared_memory_fits_sm90():
    """The front's shared memory as compiled is at most what ``smem_bytes`` counts (the routing's
    arrays at their most: grouped routing adds two), which is what decides whether a batch takes
    the front, and the model shapes' launches on an H200 (132 SMs) and an H100 PCIe (114) fit
    227 KiB, one CTA per SM; a shape that would not fit takes the GEMM path."""
    from torch_sparse_decode.ops.moe_gate_route import front

    for experts, width, topk_, groups, kept in ((896, 7168, 16, 1, 1), (256, 7168, 8, 8, 4)):
        ctas = front.ctas_for(experts, 132)
        for chunk, bulk, mma in ((front.CHUNK, False, False), (front.CHUNK, True, False), (16, True, True)):
            counted = front.smem_bytes(experts, width, ctas, chunk, mma)
            got = compiled_smem_bytes(front.compiled, experts, width, topk_, True, groups, kept, ctas, chunk,
                                      bulk=bulk, mma=mma)
            assert counted - 1024 < got <= counted, (experts, width, bulk, mma, got, counted)
    for experts, width in ((896, 7168), (256, 7168), (1024, 8192)):
        for sms in (132, 114):
            assert front.smem_bytes(experts, width, front.ctas_for(experts, sms), front.CHUNK) <= front.SMEM_LIMIT
    assert front.smem_bytes(1024, 8192, front.ctas_for(1024, 40), front.CHUNK) > front.SMEM_LIMIT


def test_router_front_switches_ask_for_one_build(monkeypatch):
    """An MMA build always stages by bulk copies: with both switches on, the catalog and the op ask
    for the MMA builds alone, keyed as with MMA alone (no second copy of each)."""
    from torch_sparse_decode.kernels.compile import MODELS, Target
    from torch_sparse_decode.ops.moe_gate_route import front

    target = Target("sm_90a", 132, MODELS)
    seen = {}
    for bulk, mma in ((False, False), (True, False), (False, True), (True, True)):
        monkeypatch.setattr(front, "BULK", bulk)
        monkeypatch.setattr(front, "MMA", mma)
        assert front.switches() == (bulk and not mma, mma)
        seen[bulk, mma] = front.compiled.catalog(target)
        assert {c[9:11] for c in seen[bulk, mma]} == {front.switches()}
    assert seen[True, True] == seen[False, True] != seen[True, False]


def test_router_front_profile_build_compiles():
    """benchmarks/profile_front.py's build: the phase stamps after the state words."""
    from torch_sparse_decode.ops.moe_gate_route import front

    assert front.compiled(256, 7168, 8, True, 8, 4, front.ctas_for(256, 132), 4, profile=True)


def _compiled_text(keep: str, kernel, *config, **named) -> str:
    """What the DSL keeps of one configuration compiled afresh: ``keep`` "ir" (the IR it hands its
    compiler) or "ptx"."""
    import tempfile
    from pathlib import Path

    from torch_sparse_decode.kernels.compile import _dsl

    env, flag = _dsl().envar, f"keep_{keep}"
    saved = env.dump_dir, getattr(env, flag)
    with tempfile.TemporaryDirectory() as dump:
        env.dump_dir = dump
        setattr(env, flag, True)
        try:
            kernel.build(*config, **named)
        finally:
            env.dump_dir = saved[0]
            setattr(env, flag, saved[1])
        suffix = ".mlir" if keep == "ir" else ".ptx"
        return "".join(p.read_text() for p in Path(dump).glob("*" + suffix) if not p.name.endswith("_clean.mlir"))


@pytest.mark.parametrize("experts,topk,groups,kept", [(384, 8, 1, 1), (896, 16, 1, 1), (256, 8, 8, 4),
                                                      (1024, 32, 1, 1), (17, 16, 1, 1), (600, 8, 1, 1)])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16])
def test_moe_route_reads_every_score_before_its_first_sigmoid(experts, topk, groups, kept, source):
    """A thread's scores and biases are all read before the first sigmoid needs one: one round
    trip to memory, not two an expert (a read used only under a branch is sunk after the sigmoid
    before it). So the PTX has 2 ceil(E / 256) global reads before its first ``ex2``."""
    f32 = torch.float32
    config = (experts, topk, True, True, groups, kept, source, f32, f32, True, True)
    ptx = _compiled_text("ptx", moe_route.compiled, *config)
    before = ptx[ptx.index("griddepcontrol.wait"):ptx.index("ex2.approx")]
    assert before.count("ld.global") == 2 * -(-experts // moe_route.THREADS)


@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (384, 8, 1, 1), (200, 8, 1, 1)])
def test_warp_routing_reads_every_score_before_its_first_sigmoid(experts, topk, groups, kept):
    """The warp kernel's lanes too: 2 ceil(E / 32) global reads before the first ``ex2``."""
    from torch_sparse_decode.ops.moe_route import warps

    f32 = torch.float32
    ptx = _compiled_text("ptx", warps.compiled, experts, topk, True, True, groups, kept, f32, f32, f32, True)
    before = ptx[ptx.index("griddepcontrol.wait"):ptx.index("ex2.approx")]
    assert before.count("ld.global") == 2 * -(-experts // 32)


@pytest.mark.parametrize("experts,topk,groups,kept", [(256, 8, 8, 4), (1024, 32, 32, 8), (64, 4, 2, 1),
                                                      (160, 6, 8, 3), (384, 8, 1, 1)])
def test_moe_route_group_warps_drops_two_barriers_at_groups_of_32(experts, topk, groups, kept):
    """The grouped step in the warps (``kernel.GROUP_WARPS``) compiles; at groups of 32 experts
    its build has two block barriers fewer, and elsewhere it is the plain build."""
    f32 = torch.float32
    config = (experts, topk, True, True, groups, kept, f32, f32, f32, True)
    plain = _compiled_text("ir", moe_route.compiled, *config).count("nvvm.barrier")
    warped = _compiled_text("ir", moe_route.compiled, *config, group_warps=True).count("nvvm.barrier")
    assert warped == plain - (2 if experts // groups == 32 and groups > 1 else 0)


# A small configuration of each CuTe kernel that takes the PDL switch (its build's arguments before ``pdl``),
# and the op whose default its catalog follows (``kernels/pdl.py``; the top-k kernels' ord16 builds: the DCP's).
PDL_BUILDS = {
    "engine": ("torch_sparse_decode.kernels.topk.engine", (torch.float32, False, 2, False, False, False), "topk"),
    "short_row": ("torch_sparse_decode.kernels.topk.short_row", (torch.float32,), "topk"),
    "moe_route": ("torch_sparse_decode.ops.moe_route.kernel", (256, 8, True, True, 8, 4), "moe_route"),
    "front": ("torch_sparse_decode.ops.moe_gate_route.front", (256, 7168, 8, True, 8, 4, 128, 1), "moe_gate_route"),
}


def test_programmatic_dependent_launch_is_chosen_per_op(monkeypatch):
    """With the switch unset each op follows ``DEFAULT_ON``, and the catalogs with it (the top-k
    kernels' ord16 builds follow the DCP pack's); TORCH_SPARSE_DECODE_PDL=1 / 0 (``ON``) sets every
    op; the CPU interpreter never launches a programmatic dependent."""
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.kernels.compile import MODELS, Target
    from torch_sparse_decode.kernels.topk import engine, short_row
    from torch_sparse_decode.ops.moe_gate_route import front
    from torch_sparse_decode.ops.moe_route import kernel as route

    target = Target("sm_90a", 132, MODELS)
    monkeypatch.setattr(pdl, "INTERPRETED", False)
    monkeypatch.setattr(pdl, "ON", None)
    monkeypatch.setattr(pdl, "DEFAULT_ON", frozenset({pdl.ROUTE, pdl.DCP}))
    assert [pdl.enabled(op) for op in (pdl.ROUTE, pdl.FRONT, pdl.TOPK, pdl.DCP)] == [True, False, False, True]
    assert {c[9] for c in route.compiled.catalog(target)} == {True}
    assert {c[8] for c in front.compiled.catalog(target)} == {False}
    assert {(c[3], c[-1]) for c in engine.compiled.catalog(target)} == {(False, False), (True, True)}
    assert {(c[3], c[1]) for c in short_row.compiled.catalog(target)} == {(False, False), (True, True)}
    for on in (True, False):
        monkeypatch.setattr(pdl, "ON", on)
        assert {pdl.enabled(op) for op in (pdl.ROUTE, pdl.FRONT, pdl.TOPK, pdl.DCP)} == {on}
    monkeypatch.setattr(pdl, "INTERPRETED", True)
    assert not pdl.enabled(pdl.ROUTE)


@pytest.mark.parametrize("name", PDL_BUILDS)
def test_a_kernel_waits_for_the_kernel_before_only_as_a_programmatic_dependent(name):
    """``kernels/pdl.py`` (the op's default, or TORCH_SPARSE_DECODE_PDL) is what the catalog asks for; a build with it
    waits for the kernel before (and lets its own dependents launch), a plain one does neither.
    The router front copies its weights (no kernel's output) before it waits."""
    import importlib

    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.kernels.compile import MODELS, Target

    module, config, op = PDL_BUILDS[name]
    compiled = importlib.import_module(module).compiled
    assert pdl.ON == {"1": True, "0": False}.get(os.environ.get("TORCH_SPARSE_DECODE_PDL", ""))
    params = list(compiled._signature.parameters)
    at, keyed = params.index("pdl"), params.index("ord16") if "ord16" in params else None
    for c in compiled.catalog(Target("sm_90a", 132, MODELS)):
        assert c[at] == pdl.enabled(pdl.for_keys(c[keyed]) if keyed is not None else op)
    marks = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")
    dependent = _compiled_text("ir", compiled, *config, pdl=True)
    assert all(mark in dependent for mark in marks)
    assert not any(mark in _compiled_text("ir", compiled, *config) for mark in marks)
    if name == "front":
        assert 0 <= dependent.find("cp.async") < dependent.find("griddepcontrol.wait")
