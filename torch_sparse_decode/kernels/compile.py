"""One compile helper for the CuTe DSL kernels: fake tensors and stream to compile from (no GPU
needed), and a cache of compiled kernels in memory and on disk.

Each kernel compiles once per process and static configuration (its constexpr tuple). The disk
cache keeps each compiled kernel as an object file, so a new process on the same machine loads in
milliseconds what an earlier one compiled (``warmup()`` then costs seconds, not minutes). Its
folder is ``$TORCH_SPARSE_DECODE_CACHE`` (default ``~/.cache/torch_sparse_decode``; set it to
``0`` to turn the disk cache off). An entry is keyed by the package's source (and by the
build function's own file where that lies outside the package: a benchmark's copy of a kernel),
the CuTe DSL version (and torch's and TVM-FFI's), the target GPU and the configuration, so an
edited kernel or an upgraded toolkit never loads a stale build.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

import cutlass
import cutlass.cute as cute

_PACKAGE = Path(__file__).resolve().parent.parent
_CACHES: list[dict] = []  # each kernel's compiled configurations in this process
_MODULES: list[Any] = []  # loaded object files, kept alive with their functions


def fake_tensor(dtype, shape: tuple, stride: tuple, align: int | None = None):
    """A compile-time stand-in for a tensor; ``cute.sym_int()`` entries stay dynamic."""
    return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align or dtype.width // 8)


def fake_stream():
    """The stream argument: the kernels launch on torch's current stream."""
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


def cache_dir() -> Path | None:
    where = os.environ.get("TORCH_SPARSE_DECODE_CACHE", str(Path.home() / ".cache" / "torch_sparse_decode"))
    return None if where in ("", "0") else Path(where)


def _target() -> str:
    if arch := os.environ.get("CUTE_DSL_ARCH"):
        return arch
    if torch.cuda.is_available():
        return "sm_{}{}".format(*torch.cuda.get_device_capability())
    return "no-gpu"


@functools.cache
def _source_hash() -> str:
    versions = [getattr(cutlass, "__version__", ""), torch.__version__]
    try:
        import tvm_ffi  # the compiled kernels' calling convention

        versions.append(getattr(tvm_ffi, "__version__", ""))
    except ImportError:
        pass
    digest = hashlib.sha256(repr(versions).encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _origin_hash(build: Callable[..., Any]) -> str:
    """The build function's file, where the package's source hash does not already cover it."""
    source = inspect.getsourcefile(build)
    path = Path(source).resolve() if source else None
    if path is None or path.is_relative_to(_PACKAGE) or not path.exists():
        return ""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entry(name: str, config: tuple, origin: str = "") -> tuple[Path, str] | None:
    folder = cache_dir()
    if folder is None:
        return None
    key = hashlib.sha256(repr((_source_hash(), origin, _target(), name, config)).encode()).hexdigest()[:24]
    symbol = f"tsd_{name}_{key}"
    return folder / f"{symbol}.o", symbol


def _load(path: Path, symbol: str):
    try:
        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        fn = getattr(module, symbol)
    except Exception:  # a truncated or foreign file: compile anew
        return None
    _MODULES.append(module)
    return fn


def _store(fn, path: Path, symbol: str) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".o", delete=False) as f:
            tmp = f.name
        fn.export_to_c(tmp, function_name=symbol)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    except Exception:  # a read-only or full disk, say: it only costs the next process a compile
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _compile(name: str, config: tuple, build: Callable[..., Any]):
    entry = _entry(name, config, _origin_hash(build))
    fn = _load(*entry) if entry is not None and entry[0].exists() else None
    if fn is None:
        fn = build(*config)
        if entry is not None:
            _store(fn, *entry)
    return fn


def cached_kernel(name: str):
    """Decorator: ``build(*config)`` compiles kernel ``name`` at one static configuration
    (``cute.compile`` from fake tensors); the decorated function returns it from the process's
    cache, else from the disk cache, else compiles it once."""

    def wrap(build: Callable[..., Any]):
        signature = inspect.signature(build)
        by_call: dict[tuple, Any] = {}  # as the caller spelled the arguments: the fast path
        by_config: dict[tuple, Any] = {}  # every argument, defaults filled in

        @functools.wraps(build)
        def compiled(*args, **kwargs):
            key = (args, tuple(kwargs.items())) if kwargs else args
            fn = by_call.get(key)
            if fn is None:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                config = tuple(bound.arguments.values())
                fn = by_config.get(config)
                if fn is None:
                    fn = by_config[config] = _compile(name, config, build)
                by_call[key] = fn
            return fn

        compiled.cache_clear = lambda: (by_call.clear(), by_config.clear())
        _CACHES.extend((by_call, by_config))
        return compiled

    return wrap


def clear_memory() -> None:
    """Forget every kernel this process compiled or loaded (the next call asks the disk cache)."""
    for memo in _CACHES:
        memo.clear()
