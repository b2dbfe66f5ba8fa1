"""Kernels built ahead of time (``python -m torch_sparse_decode.build_kernels``), on this machine
without a GPU: the catalogs, the keys that travel, the build itself for SM90 and SM100, and
``warmup()``'s parallel compile of what its cache lacks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")

from torch_sparse_decode import build_kernels  # noqa: E402
from torch_sparse_decode.kernels import compile as helper  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch_sparse_decode"
KERNELS = {"topk_engine", "topk_short_row", "moe_route", "moe_route_warps", "moe_gate_route", "dcp_merge"}


def run_build(*args: str, timeout: int = 3000) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CUTE_DSL_ARCH", "TORCH_SPARSE_DECODE_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "torch_sparse_decode.build_kernels", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_every_cached_kernel_is_found_and_has_a_catalog():
    """The build and warmup() find every kernel by its decorator, and each lists configurations
    for both architectures we build for."""
    kernels = helper.import_kernels()
    assert KERNELS <= set(kernels)
    for name in KERNELS:
        for arch, sms in helper.DEFAULT_SMS.items():
            assert kernels[name].catalog(helper.Target(arch, sms[0])), (name, arch)


def test_the_engine_catalog_holds_every_configuration_the_ops_take():
    from torch_sparse_decode.kernels import topk

    catalog = set(topk.compiled.catalog(helper.Target("sm_90a", 132)))
    for ctas in topk.CLUSTER_SIZES:
        for source in topk.SOURCES:
            pinned = source is torch.int32
            assert topk.compiled.config(source, pinned, ctas) in catalog  # select(), every op
            assert topk.compiled.config(source, pinned, ctas, fused=True) in catalog  # the fused ops
        for source in (torch.float32, torch.bfloat16):  # the DCP pack
            assert topk.compiled.config(source, False, ctas, ord16=True) in catalog
    assert len(catalog) == 40


def test_the_routing_catalogs_follow_the_models_and_the_gpu():
    """moe_route takes each model's scores and logits in fp32 and bf16; the front's grid follows
    the SM count, and a model whose weight rows do not fit a launch gets no front."""
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.ops.moe_gate_route import front
    from torch_sparse_decode.ops.moe_route import kernel as route

    deepseek = helper.RoutedModel("DeepSeek-V3", 256, 8, 8, 4)
    wide = helper.RoutedModel("too wide", 1024, 8, hidden=16384)
    target = helper.Target("sm_90a", 132, (deepseek, wide))
    asked = route.compiled.config(256, 8, True, True, 8, 4, torch.bfloat16,
                                  pdl=pdl.enabled(pdl.ROUTE), group_warps=route.GROUP_WARPS)  # as the op asks
    assert asked in route.compiled.catalog(target)
    assert len(route.compiled.catalog(target)) == 8
    fronts = front.compiled.catalog(target)
    assert [c[0] for c in fronts] == [256] * 3 and {c[7] for c in fronts} == {1, 2, 4}
    assert {c[6] for c in front.compiled.catalog(helper.Target("sm_100a", 20, (deepseek,)))} == \
        {front.ctas_for(256, 20)}


def test_a_kernels_sources_are_its_module_and_what_it_imports():
    """The key names the files a kernel is built from, not the whole package (the engine's: not
    ``launch.py``): an edit to another op leaves the engine's objects valid."""
    from torch_sparse_decode.kernels import topk
    from torch_sparse_decode.ops.moe_gate_route import front

    def files(kernel):
        path = Path(kernel.build.__code__.co_filename).resolve()
        return {p.relative_to(PACKAGE).as_posix() for p in helper.source_files(kernel.build.__module__, path)}

    engine = {f"kernels/topk/{name}.py" for name in ("engine", "cluster", "digits", "keys", "layout", "one_read",
                                                     "output", "stream")}
    assert files(topk.compiled) == engine | {"kernels/compile.py", "kernels/cute.py", "kernels/pdl.py", "dtypes.py"}
    used = files(front.compiled)
    assert {"ops/moe_gate_route/front.py", "ops/moe_route/kernel.py", "limits.py", "kernels/cute.py"} <= used
    assert "kernels/topk/engine.py" not in used and "ops/moe_gate_route/op.py" not in used


def test_the_key_names_the_arch_config_and_toolchain_not_torch_or_the_folder(tmp_path, monkeypatch):
    from torch_sparse_decode.ops.moe_route import kernel as route

    kernel, config = route.compiled, route.compiled.config(256, 8, True, True, 8, 4)
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path / "a"))
    path, symbol = kernel.entry(config)
    assert path.parent == tmp_path / "a" and symbol in path.name
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path / "b"))
    assert kernel.entry(config)[0].name == path.name  # not the folder
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert kernel.entry(config)[0].name == path.name  # not torch's version
    assert kernel.entry(kernel.config(256, 8, True, False, 8, 4))[0].name != path.name
    monkeypatch.setattr(helper, "_versions", lambda: ("4.9.0", "0.1.15"))
    assert kernel.entry(config)[0].name != path.name  # another DSL
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path / "a"))
    dsl = helper._dsl().envar
    monkeypatch.setattr(dsl, "arch", "sm_100a")
    assert "arch='sm_100a'" in helper.toolchain()
    assert kernel.entry(config)[0].name != path.name  # another architecture


def test_the_toolchain_names_the_compiler_libraries_but_not_their_path():
    shared = [item for item in eval(helper.toolchain())[1] if item.startswith("shared_libs=")]
    assert len(shared) == 1 and "site-packages" not in shared[0] and "/lib/" in shared[0]


def test_one_kernel_of_each_builds_for_sm90_and_sm100(tmp_path):
    """The build on this CPU machine: each kernel's first configuration for SM90 and SM100, its
    log and summary; a second run finds them all there."""
    out = tmp_path / "kernels"
    done = run_build("--arch", "sm_90a", "--arch", "sm_100a", "--out", str(out), "--one-per-kernel", "--jobs", "2")
    objects = sorted(out.glob("*.o"))
    assert len(objects) == 2 * len(KERNELS) and {p.name.split("_")[1] for p in objects} >= {"topk", "moe", "dcp"}
    assert f"built {len(objects)} kernel objects for sm_90a, sm_100a" in done.stdout
    assert sum(line.startswith("[") and " sm_100a " in line for line in done.stdout.splitlines()) == len(KERNELS)
    assert all(os.stat(p).st_mode & 0o044 == 0o044 for p in objects)  # another user may load them
    triton = [line for line in done.stdout.splitlines() if line.startswith("Triton ")]  # kernels/triton_cache
    assert [line.split(" for ")[1].split()[0] for line in triton] == ["sm_90a", "sm_100a"]
    assert len(list((out / "triton").glob("*/*/__grp__*.json"))) > 0
    again = run_build("--arch", "sm_90a", "--out", str(out), "--one-per-kernel", "--quiet")
    assert "built 0 kernel objects for sm_90a" in again.stdout and f"{len(KERNELS)} were already there" in again.stdout


def test_ptx_manifest_names_no_module_path(tmp_path):
    """--ptx keeps each configuration's PTX with its entry renamed, so a refactor that moves a
    kernel's class to another module can show its PTX unchanged."""
    run_build("--arch", "sm_90a", "--ptx", str(tmp_path), "--kernels", "moe_route", "--one-per-kernel", "--quiet")
    (line,) = (tmp_path / "manifest.txt").read_text().splitlines()
    (ptx,) = tmp_path.glob("sm_90a-moe_route-*.ptx")
    assert line.split()[1:3] == ["sm_90a", "moe_route"] and ".entry KERNEL(" in ptx.read_text()
    assert "torch_sparse_decode" not in ptx.read_text()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_every_kernel_builds(arch, tmp_path):
    """The whole catalog compiles from fake tensors for H100 / H200 (SM90) and B200 (SM100): a
    kernel or configuration that stops compiling fails here."""
    out = tmp_path / "kernels"
    run_build("--arch", arch, "--out", str(out), "--jobs", str(len(os.sched_getaffinity(0))), "--quiet", "--no-triton")
    jobs = build_kernels.plan([arch], {arch: list(helper.DEFAULT_SMS[arch])}, helper.MODELS)
    assert len(list(out.glob("*.o"))) == len(jobs) and {job.kernel for job in jobs} == KERNELS


def test_warmup_compiles_what_the_cache_lacks_in_parallel_then_loads_it(tmp_path, monkeypatch):
    """warmup()'s catalog step: the missing objects compile in a subprocess (two workers), then
    this process loads every one of them without compiling."""
    from torch_sparse_decode.ops.moe_route import kernel as route

    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    monkeypatch.setenv(build_kernels.JOBS_ENV, "2")
    monkeypatch.setattr(helper, "device_target", lambda device: helper.Target("sm_90a", 132))
    monkeypatch.setattr(helper, "import_kernels", lambda: {"moe_route": route.compiled})
    helper.clear_memory()
    import cutlass.cute as cute

    monkeypatch.setattr(cute, "compile", lambda *a, **k: pytest.fail("compiled in this process"))
    catalog = route.compiled.catalog(helper.Target("sm_90a", 132))
    assert build_kernels.warm_catalogs(torch.device("cuda", 0)) == len(catalog)
    assert len(list(tmp_path.glob("tsd_moe_route_*.o"))) == 20
    helper.clear_memory()


def test_warmup_compiles_in_process_when_the_parallel_build_times_out(tmp_path, monkeypatch):
    """A parallel build that does not finish within its bound never hangs warmup(): it warns and
    compiles what is left itself."""
    from torch_sparse_decode.ops.moe_route import kernel as route

    def never_done(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout"))

    model = helper.RoutedModel("DeepSeek-V3", 256, 8, 8, 4)
    monkeypatch.setenv("TORCH_SPARSE_DECODE_CACHE", str(tmp_path))
    monkeypatch.setenv(build_kernels.JOBS_ENV, "2")
    monkeypatch.setattr(helper, "device_target", lambda device: helper.Target("sm_90a", 132, (model,)))
    monkeypatch.setattr(helper, "import_kernels", lambda: {"moe_route": route.compiled})
    monkeypatch.setattr(build_kernels.subprocess, "run", never_done)
    helper.clear_memory()
    with pytest.warns(UserWarning, match="no result within 3600 s"):
        assert build_kernels.warm_catalogs(torch.device("cuda", 0)) == 4
    assert len(list(tmp_path.glob("tsd_moe_route_*.o"))) == 4  # compiled here, and stored
    helper.clear_memory()
