"""Triton's cache filled ahead of time, on a machine without a GPU.

The Triton kernels (the block-key pass, the DCP pack, ``decode_row_lengths``) compile on their
first launch, and Triton keeps what it compiled in its cache folder (``TRITON_CACHE_DIR``, by
default ``~/.triton/cache``), under a key that names Triton itself (its version and the hash of
its sources and library), the kernel's source, the launch's specializations (argument dtypes,
16-byte alignments, integers equal to 1 or divisible by 16, the constexprs), the options, the
target GPU and the ptxas version. Nothing in it needs the GPU: a launch's specializations follow
from its arguments, which CPU tensors of the same shapes reproduce.

``fill`` runs each CUDA kernel module's ``warm_triton(device)`` (its Triton launches at the shapes
``warmup()`` uses) on CPU tensors, with Triton pointed at a target GPU that is not here and every
launch turned into a compile (``JITFunction.run(warmup=True)``). Each kernel's host launcher (a
small C extension Triton builds with the system's C compiler on first launch) is built too,
linked against a stub ``libcuda.so.1`` and not loaded; one that does not load where it is used
(another C library) is rebuilt there by Triton.

The entries go under ``DIR/triton/<identity>``, the identity being a digest of Triton's own key:
built with the serving image's Triton (and Python, for the launchers), they are the entries its
launches look up. ``seed`` copies them into Triton's cache folder at ``warmup()``; a folder built
with another Triton has another identity and is never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

FOLDER = "triton"  # under the kernel folder ($TORCH_SPARSE_DECODE_CACHE)
# What a launch loads of an entry: the metadata and group files, the binary, a host module. The
# IRs (ttir, ttgir, llir, ptx, source: three quarters of the bytes) are for reading, not loading.
LOADED = (".json", ".cubin", ".so")


def identity() -> str:
    """A digest of Triton's key (its version, sources and compiled library): entries built under
    one identity are the ones a Triton of that identity looks up."""
    from triton.runtime.cache import triton_key

    return hashlib.sha256(triton_key().encode()).hexdigest()[:16]


def triton_cache_dir() -> Path:
    """The folder Triton's file cache reads and writes ($TRITON_CACHE_DIR, else its default)."""
    from triton import knobs

    return Path(knobs.cache.dir)


class _TargetDriver:
    """Triton's view of a GPU that is not here: the target to compile for, device 0, stream 0."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True

    @property
    def utils(self):  # the host module (built, not loaded, in ``_launchers``); newer Tritons launch through it
        from triton.backends.nvidia.driver import CudaUtils

        return CudaUtils()


def _capability(arch: str) -> int:
    """``sm_90a`` -> 90: the compute capability Triton's CUDA target names."""
    digits = arch.removeprefix("sm_").rstrip("af")
    if not digits.isdigit():
        raise ValueError(f"arch {arch!r}: expected sm_<major><minor>[a|f], e.g. sm_90a")
    return int(digits)


@contextlib.contextmanager
def compile_only(arch: str, cache: Path, compiled: list):
    """Within: Triton compiles every launch for ``arch`` into ``cache`` and launches nothing; each
    compiled kernel is appended to ``compiled``."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    previous = getattr(driver, "_active", None)  # None until something asked for the driver

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    driver.set_active(_TargetDriver(GPUTarget("cuda", _capability(arch), 32)))
    JITFunction.run = compile_instead
    try:
        with knobs.cache.scope():
            knobs.cache.dir = str(cache)
            yield
    finally:
        JITFunction.run = run
        driver._active = previous  # not reset_active(): with no GPU here it has no driver to create


class _Unloaded:
    """A built host module, not loaded (its libcuda is a stub here): every attribute a no-op."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _stub_libcuda() -> str:
    """C source of a stand-in libcuda.so.1: every driver entry point Triton's cuda.h names, empty.
    A launcher calls some directly (cuFuncSetAttribute): linked against these, it records
    libcuda.so.1 as needed, so the GPU machine's driver resolves them when the launcher loads
    (a stub without them drops the library, and the load fails: undefined symbol)."""
    from triton.backends.nvidia import driver as cuda

    header = (Path(cuda.__file__).parent / "include" / "cuda.h").read_text()
    return "".join(f"void {name}(void) {{}}\n" for name in sorted(set(re.findall(r"\bcu[A-Z]\w*", header))))


def _launchers(kernels: list, cache: Path) -> int:
    """Build each kernel's host launcher (and Triton's CUDA utilities) into ``cache``, linked
    against a stub libcuda and not loaded; returns the host modules in ``cache`` (0 without a C
    compiler)."""
    from triton import knobs
    from triton.runtime import build as host

    cc = shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return 0
    from triton.backends.nvidia import driver as cuda

    load = host._load_module_from_path
    with tempfile.TemporaryDirectory() as stub, knobs.cache.scope(), knobs.nvidia.scope():
        knobs.cache.dir = str(cache)
        (Path(stub) / "stub.c").write_text(_stub_libcuda())
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(Path(stub) / "libcuda.so.1"),
                        str(Path(stub) / "stub.c")], check=True, capture_output=True)
        knobs.nvidia.libcuda_path = stub
        cuda.libcuda_dirs.cache_clear()
        cuda.library_dirs.cache_clear()
        host._load_module_from_path = lambda name, path: _Unloaded()
        try:
            for build in [cuda.CudaUtils] + [lambda k=k: cuda.CudaLauncher(k.src, k.metadata) for k in kernels]:
                try:
                    build()
                except Exception as err:  # noqa: BLE001  (an optimisation: Triton builds it on first launch)
                    warnings.warn(f"torch_sparse_decode: a Triton launcher was not built ahead of time ({err})")
        finally:
            host._load_module_from_path = load
            cuda.libcuda_dirs.cache_clear()
            cuda.library_dirs.cache_clear()
    return len(list(cache.glob("*/*.so")))


def compile_warm(arch: str, cache: Path, modules: list[str]) -> list:
    """Compile the Triton launches of each module's ``warm_triton`` for ``arch`` into Triton's
    file cache at ``cache``, launching nothing; returns the compiled kernels."""
    compiled: list = []
    with compile_only(arch, cache, compiled):
        for name in modules:
            module = importlib.import_module(name)
            if hasattr(module, "warm_triton"):
                module.warm_triton(torch.device("cpu"))
    return list({id(kernel): kernel for kernel in compiled}.values())


def fill(folder: Path, arch: str, modules: list[str]) -> tuple[int, int]:
    """``compile_warm`` into ``folder/triton/<identity>``, and the kernels' host launchers, keeping
    only what a launch loads; returns (kernels compiled, host modules there)."""
    cache = folder / FOLDER / identity()
    cache.mkdir(parents=True, exist_ok=True)
    kernels = compile_warm(arch, cache, modules)
    with compile_only(arch, cache, []):  # newer Tritons ask the driver while building a launcher
        launchers = _launchers(kernels, cache)
    for entry in cache.iterdir():
        for path in entry.iterdir():
            if path.suffix not in LOADED:
                path.unlink()
        _relocate(entry, entry)
    return len(kernels), launchers


def _relocate(entry: Path, home: Path) -> None:
    """Point ``entry``'s group files (``__grp__*.json``: Triton lists a compiled kernel's files by
    absolute path, and takes a group with a missing file for a miss) at ``home``, listing only
    the files the entry holds."""
    for group in entry.glob("__grp__*.json"):
        paths = json.loads(group.read_text())["child_paths"]
        moved = {name: str(home / name) for name in paths if (entry / name).exists()}
        group.write_text(json.dumps({"child_paths": moved}))


def seed(folder: Path | None) -> int:
    """Copy the entries that ``folder`` holds for this Triton into Triton's cache folder, where
    missing; returns the entries copied. A folder that cannot be read, or a cache that cannot be
    written, copies nothing (the kernels then compile on first launch, as without a folder)."""
    if folder is None:
        return 0
    source = folder / FOLDER / identity()
    if not source.is_dir():
        return 0
    target = triton_cache_dir()
    copied = 0
    try:
        target.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if (target / entry.name).exists():
                continue
            with tempfile.TemporaryDirectory(dir=target) as staging:  # whole, or not at all
                staged = Path(staging) / entry.name
                shutil.copytree(entry, staged)
                _relocate(staged, target / entry.name)
                with contextlib.suppress(OSError):  # another process got there first
                    staged.rename(target / entry.name)
                    copied += 1
    except (OSError, ValueError, KeyError) as err:
        warnings.warn(f"torch_sparse_decode: Triton's cache was not seeded from {source} ({err})")
    return copied
