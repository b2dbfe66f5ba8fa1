"""One compile helper for the CuTe DSL kernels: fake tensors and stream to compile from (no GPU
needed), a cache of compiled kernels in memory and on disk, and each kernel's catalog (the
configurations that ``warmup()`` loads and ``python -m torch_sparse_decode.build_kernels``
builds ahead of time).

Each kernel compiles once per process and static configuration (its constexpr tuple). The disk
cache keeps each compiled kernel as an object file, so a new process loads in milliseconds what
an earlier one (or a build on another machine) compiled. Its folder is
``$TORCH_SPARSE_DECODE_CACHE`` (default ``~/.cache/torch_sparse_decode``; ``0`` turns it off).

An entry's key names what its object depends on, and nothing else:

- the source the kernel is built from: the build function's file and every file of this package
  that it imports, transitively (``source_files``), so an edit elsewhere keeps the entry;
- the toolchain: the CuTe DSL and TVM-FFI versions and the DSL's compiler libraries (cu12 or
  cu13), and the DSL's compile settings, the target architecture among them (``sm_90a`` on an
  H100 or H200: what the DSL detects there, or ``CUTE_DSL_ARCH`` on a machine without a GPU);
- the kernel's name and configuration.

Not torch's version: the kernels compile from fake tensors with no torch in the path and take
tensors through TVM-FFI's DLPack calling convention, and a build made beside torch 2.13 is byte
for byte the one made beside 2.14 (docs/cold_start.md). Nor the Python version, the machine or
the folder's path. So an object built on a CPU machine for sm_90a is the one an H100 or H200
loads. The object's symbol carries the key too: a file copied or renamed to another entry's name
does not load, and the kernel compiles anew.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import cutlass
import cutlass.cute as cute

_PACKAGE = Path(__file__).resolve().parent.parent
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


# ---------------------------------------------------------------------------------------------
# Keys.


def _dsl():
    from cutlass.cutlass_dsl import CuTeDSL

    return CuTeDSL._get_dsl()


def target_arch() -> str:
    """The architecture the DSL compiles for here: ``CUTE_DSL_ARCH``, else the GPU's (``sm_90a``)."""
    return _dsl().envar.arch


@functools.cache
def _versions() -> tuple[str, ...]:
    import tvm_ffi

    return getattr(cutlass, "__version__", "?"), getattr(tvm_ffi, "__version__", "?")


def toolchain() -> str:
    """The DSL's compile settings (architecture included) and the toolchain's versions. The DSL
    names its compiler libraries by path; only the path's tail (``cu13/lib/...``) is kept."""
    settings = []
    for item in _dsl().envar.cache_key_str().split(";"):
        name, _, value = item.partition("=")
        if name == "shared_libs":
            value = "/".join(Path(value.strip("'\"")).parts[-3:])
        settings.append(f"{name}={value}")
    return repr((_versions(), settings))


def _imported(node: ast.AST, package: str) -> list[str]:
    """The absolute names of the modules an import statement loads: ``from M import a, b``
    loads the submodules among a and b, and M where a name is not one."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
    if base.split(".")[0] != _PACKAGE.name:
        return []
    names = [f"{base}.{alias.name}" for alias in node.names]
    submodules = [name for name in names if _spec_origin(name) is not None]
    return submodules + ([base] if len(submodules) < len(names) else [])


def _spec_origin(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):  # an attribute, not a module
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


@functools.cache
def source_files(module: str, path: Path) -> tuple[Path, ...]:
    """The files a kernel is built from: module ``module`` at ``path`` and every module of this
    package, or of the folder of ``path`` (a benchmark's copy of a kernel package), that it
    imports, transitively (any import statement in it, at any depth)."""
    top = _PACKAGE.name
    roots = (_PACKAGE, path.parent)
    seen: dict[Path, None] = {}
    todo = [(module, path)]
    while todo:
        name, file = todo.pop()
        if file in seen:
            continue
        seen[file] = None
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_bytes())):
            for target in _imported(node, package):
                if target.split(".")[0] == top and (origin := _spec_origin(target)) is not None:
                    if any(origin.is_relative_to(root) for root in roots):
                        todo.append((target, origin))
    return tuple(sorted(seen))


@functools.cache  # once per kernel and process, as the files are read once
def _source_digest(build: Callable[..., Any]) -> str:
    path = Path(inspect.getsourcefile(build)).resolve()
    digest = hashlib.sha256()
    for file in source_files(build.__module__, path):
        name = file.relative_to(_PACKAGE).as_posix() if file.is_relative_to(_PACKAGE) else file.name
        digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Catalogs: the configurations each kernel is warmed and prebuilt at.


@dataclass(frozen=True)
class RoutedModel:
    """The MoE routing of a model we serve: ``moe_route``'s configuration, and the router
    front's (``hidden``: the router GEMM's width)."""

    name: str
    experts: int
    topk: int
    groups: int = 1
    topk_group: int = 1
    hidden: int = 7168
    renormalize: bool = True

    @property
    def grouping(self) -> tuple[int, int]:
        """(groups, kept) as the kernels take them: (1, 1) for ungrouped routing."""
        return (self.groups, self.topk_group) if self.groups > 1 else (1, 1)


# The models whose routing warmup() loads and build_kernels builds (``--route`` adds more).
MODELS = (
    RoutedModel("DeepSeek-V3 / V3.2", 256, 8, 8, 4),
    RoutedModel("Kimi-K2", 384, 8),
    RoutedModel("Kimi-K3", 896, 16),
    RoutedModel("512 / 22", 512, 22),
    RoutedModel("1024 / 32", 1024, 32),
)

# SM counts prebuilt by default, by architecture: H100 SXM and H200 (132), B200 (148).
DEFAULT_SMS = {"sm_90a": (132,), "sm_100a": (148,)}


@dataclass(frozen=True)
class Target:
    """What a catalog is for: the DSL's architecture, the GPU's SM count (the router front's
    grid follows it) and the routed models."""

    arch: str
    sms: int
    models: tuple[RoutedModel, ...] = MODELS


def device_target(device) -> Target:
    """The target of a CUDA device in this process."""
    import torch

    return Target(target_arch(), torch.cuda.get_device_properties(device).multi_processor_count)


class CachedKernel:
    """A kernel's compiled configurations: ``kernel(*config)`` returns it from the process's
    cache, else from the disk cache, else compiles it once (``build(*config)``: ``cute.compile``
    from fake tensors). ``catalog(target)``: the configurations warmed and prebuilt."""

    def __init__(self, name: str, build: Callable[..., Any], catalog: Callable[[Target], Iterable[tuple]]):
        functools.update_wrapper(self, build)
        self.name, self.build, self._catalog = name, build, catalog
        self._signature = inspect.signature(build)
        self._by_call: dict[tuple, Any] = {}  # as the caller spelled the arguments: the fast path
        self._by_config: dict[tuple, Any] = {}  # every argument, defaults filled in

    def __call__(self, *args, **kwargs):
        key = (args, tuple(kwargs.items())) if kwargs else args
        fn = self._by_call.get(key)
        if fn is None:
            config = self.config(*args, **kwargs)
            fn = self._by_config.get(config)
            if fn is None:
                fn = self._by_config[config] = self._compile(config)
            self._by_call[key] = fn
        return fn

    def config(self, *args, **kwargs) -> tuple:
        """The configuration of a call: every argument, defaults filled in."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def catalog(self, target: Target) -> list[tuple]:
        """The configurations prebuilt and warmed for ``target``, each once, in order."""
        return list(dict.fromkeys(self.config(*c) for c in self._catalog(target)))

    def entry(self, config: tuple) -> tuple[Path, str] | None:
        """(object file, symbol) of ``config`` in the disk cache; None when it is off."""
        folder = cache_dir()
        if folder is None:
            return None
        material = (toolchain(), _source_digest(self.build), self.name, config)
        key = hashlib.sha256(repr(material).encode()).hexdigest()[:24]
        symbol = f"tsd_{self.name}_{key}"
        return folder / f"{symbol}.o", symbol

    def _compile(self, config: tuple):
        entry = self.entry(config)
        fn = _load(*entry) if entry is not None and entry[0].exists() else None
        if fn is None:
            fn = self.build(*config)
            if entry is not None:
                _store(fn, *entry)
        return fn

    def cache_clear(self) -> None:
        self._by_call.clear()
        self._by_config.clear()


KERNELS: dict[str, CachedKernel] = {}  # every cached kernel of the process, by name


def cached_kernel(name: str, catalog: Callable[[Target], Iterable[tuple]] = lambda target: ()):
    """Decorator: ``build(*config)`` compiles kernel ``name`` at one static configuration; the
    result is a ``CachedKernel``. ``catalog(target)`` lists the configurations to warm and
    prebuild (the rest compile on first use)."""

    def wrap(build: Callable[..., Any]) -> CachedKernel:
        KERNELS[name] = kernel = CachedKernel(name, build, catalog)
        return kernel

    return wrap


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
        os.chmod(tmp, 0o644)  # a serving image's kernels are built by one user and loaded by another
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    except Exception:  # a read-only or full disk, say: it only costs the next process a compile
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def clear_memory() -> None:
    """Forget every kernel this process compiled or loaded (the next call asks the disk cache)."""
    for kernel in KERNELS.values():
        kernel.cache_clear()


def import_kernels() -> dict[str, CachedKernel]:
    """Import every module of the package that defines a cached kernel (found by its decorator,
    so a new kernel cannot be left out); returns ``KERNELS``."""
    for path in sorted(_PACKAGE.rglob("*.py")):
        if path != Path(__file__).resolve() and b"@cached_kernel(" in path.read_bytes():
            importlib.import_module(".".join(path.relative_to(_PACKAGE.parent).with_suffix("").parts))
    return KERNELS
