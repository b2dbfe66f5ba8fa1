"""Triton's cache filled ahead of time without a GPU (``kernels/triton_cache``): the fill compiles
the warm-up launches for SM90, and a process seeded from the folder finds every one of them (no
compile, no file rewritten). Run in subprocesses without the interpreter (the tests' default)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_DIR")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(clean, CUTE_DSL_ARCH="sm_90a", **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")
            if p.is_file()}


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """A folder filled, then moved (as into a serving image: Triton's files name their absolute
    paths, so a seeded entry must not lean on the folder it came from)."""
    built = tmp_path_factory.mktemp("built")
    _python(f"from pathlib import Path\nfrom torch_sparse_decode.build_kernels import fill_triton\n"
            f"fill_triton(['sm_90a'], Path({str(built)!r}))")
    return built.rename(built.with_name(built.name + "-carried"))


# The Triton kernels the opt-in switches add to the warm-ups (README's switch table), by variable.
OPT_IN_KERNELS = {"TORCH_SPARSE_DECODE_ROUTER_SPLIT": "_router_split"}


def test_fill_compiles_every_triton_warm_up(filled):
    (built,) = (filled / "triton").iterdir()
    names = {json.loads(p.read_text())["name"] for p in built.glob("*/*.json") if not p.name.startswith("__grp__")}
    switched_on = {name for variable, name in OPT_IN_KERNELS.items() if os.environ.get(variable) == "1"}
    assert names == {"_block_keys", "pack_kernel", "_row_lengths"} | switched_on
    assert {p.suffix for p in built.glob("*/*")} <= {".json", ".cubin", ".so"}  # what a launch loads
    assert all(json.loads(p.read_text())["target"]["arch"] == 90 for p in built.glob("*/[!_]*.json"))


def test_each_host_launcher_needs_the_driver(filled):
    """Each prebuilt host module names libcuda.so.1 as needed, so the GPU machine's driver resolves
    the entry points it calls directly (cuFuncSetAttribute) when it loads; without that the load
    failed there (undefined symbol) and Triton built every launcher again."""
    import shutil

    if shutil.which("objdump") is None:
        pytest.skip("needs objdump (binutils)")
    modules = list((filled / "triton").glob("*/*/*.so"))
    assert modules
    for module in modules:
        dynamic = subprocess.run(["objdump", "-p", str(module)], capture_output=True, text=True, check=True).stdout
        assert re.search(r"NEEDED\s+libcuda\.so\.1", dynamic), module.name


def test_a_seeded_process_finds_every_kernel(filled, tmp_path):
    """Seeded, then the warm-up launches compiled again: every one a hit (no file written)."""
    cache = tmp_path / "triton-cache"
    code = (
        "from pathlib import Path\n"
        "from torch_sparse_decode._library import cuda_kernels\n"
        "from torch_sparse_decode.kernels import triton_cache as tc\n"
    )
    seeded = int(_python(code + f"print(tc.seed(Path({str(filled)!r})))\n", TRITON_CACHE_DIR=str(cache)))
    assert seeded == len(list(next((filled / "triton").iterdir()).iterdir())) > 0
    before = _snapshot(cache)
    _python(code + "tc.compile_warm('sm_90a', tc.triton_cache_dir(), sorted(set(cuda_kernels().values())))\n",
            TRITON_CACHE_DIR=str(cache))
    assert _snapshot(cache) == before


def test_a_folder_built_by_another_triton_is_not_read(tmp_path):
    (tmp_path / "triton" / "0123456789abcdef" / "ENTRY").mkdir(parents=True)
    code = f"from pathlib import Path\nfrom torch_sparse_decode.kernels import triton_cache as tc\n" \
           f"print(tc.seed(Path({str(tmp_path)!r})))\n"
    assert _python(code, TRITON_CACHE_DIR=str(tmp_path / "cache")).split() == ["0"]


@pytest.mark.gpu
def test_warmup_compiles_no_triton_kernel_the_folder_holds(tmp_path):
    """On a GPU, with the session's kernel folder ($TORCH_SPARSE_DECODE_CACHE) built by this
    Triton: a fresh process's warmup() adds no entry to an empty Triton cache beyond the seeded
    ones (each added entry is a launch the fill did not foresee)."""
    from torch_sparse_decode.kernels.triton_cache import FOLDER, identity

    folder = Path(os.environ.get("TORCH_SPARSE_DECODE_CACHE", "0"))
    built = folder / FOLDER / identity()
    if not built.is_dir():
        pytest.skip(f"{folder} holds no Triton kernels of this Triton (build_kernels run beside it fills them)")
    cache = tmp_path / "triton-cache"
    _python("import torch_sparse_decode as tsd\ntsd.warmup()\n", TRITON_CACHE_DIR=str(cache),
            TORCH_SPARSE_DECODE_CACHE=str(folder))
    seeded = {entry.name for entry in built.iterdir()}
    added = sorted(json.loads(p.read_text())["name"] for p in cache.glob("*/[!_]*.json") if p.parent.name not in seeded)
    assert not added, f"warmup() compiled Triton kernels the folder lacks: {added}"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_opt_in_triton_kernels_compile_for_the_gpu(arch, tmp_path):
    """The split router GEMM (opt-in, so the fill leaves it out) builds for
    the GPU, not only for the interpreter, in each dtype it takes, and as programmatic dependents."""
    code = f"""
import torch
from pathlib import Path
from torch_sparse_decode.kernels import triton_cache as tc
from torch_sparse_decode.kernels import pdl
from torch_sparse_decode.ops.moe_gate_route import split
built = []
with tc.compile_only({arch!r}, Path({str(tmp_path)!r}), built):
    pdl.ON = split.SPLIT = True  # as warmup() builds them
    split.warm(torch.device("cpu"))
print(len(built), *sorted({{kernel.name for kernel in built}}))
"""
    assert _python(code).split() == ["15", "_router_split"]
