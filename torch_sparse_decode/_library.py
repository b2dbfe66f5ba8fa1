"""One registration helper for every op of the ``sparse_decode`` namespace, and argument checks.

Each op is a ``torch.library.custom_op`` that writes into caller-owned outputs and returns nothing:

- the reference (pure torch) is the default implementation: the CPU kernel;
- ``cuda`` names the module of the op's CUDA kernel (a function of the op's name, and optionally
  ``warm_triton(device)`` and ``warm(device)``), imported on first use, so importing the package
  needs neither CuTe DSL nor Triton. Where the module cannot load, the op warns and serves CUDA
  tensors by its reference;
- the fake implementation only checks the arguments (outputs already exist, nothing to allocate);
- every implementation runs the op's ``check`` first, so a bad argument raises a ``TypeError`` or
  ``ValueError`` naming it before anything is launched, on every device and under
  ``torch.compile`` (where the fake implementation runs at trace time).

Checks read tensor metadata only (dtype, device, shape, strides): never data, so no host sync.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import operator
import warnings
from types import ModuleType
from typing import Callable, Iterable, Sequence

import torch

from .limits import TOPK_MAX_K, TOPK_MAX_ROWS, TOPK_MAX_WIDTH

NAMESPACE = "sparse_decode"

_OPS: dict[str, "torch._library.custom_ops.CustomOpDef"] = {}
_CUDA: dict[str, str] = {}  # op -> the module of its CUDA kernel
_WARMED: list[str] = []  # kernel modules with a warmup hook


def define_op(name: str, mutates_args: Sequence[str], check: Callable[..., None], cuda: str | None = None):
    """Decorator: register ``fn`` (the reference) as ``sparse_decode::name``, checked by ``check``.
    ``cuda``: the module of the CUDA kernel, imported on first use (see the module docstring)."""

    def wrap(reference: Callable[..., None]):
        checked = _checked(reference, check)
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=tuple(mutates_args))(checked)

        @op.register_fake
        def _fake(*args, **kwargs):
            check(*args, **kwargs)

        if cuda is not None:
            _CUDA[name] = cuda
            load = functools.partial(importlib.import_module, cuda)
            op.register_kernel("cuda")(_checked(_lazy_kernel(name, load, reference), check))
            if cuda not in _WARMED:
                _WARMED.append(cuda)
                register_warmup(functools.partial(_warm_kernels, load))
        _OPS[name] = op
        return op

    return wrap


def cuda_kernels() -> dict[str, str]:
    """Op name -> the module of its CUDA kernel, for every op that has one."""
    return dict(_CUDA)


_UNAVAILABLE: dict[str, str] = {}  # op -> why its CUDA kernel could not load (the reference serves it)


def _load(cuda: Callable[[], ModuleType], name: str = "") -> ModuleType | None:
    try:
        return cuda()
    except ImportError as err:
        warnings.warn(f"torch_sparse_decode: a CUDA kernel is unavailable ({err}); using the reference on CUDA")
        if name:
            _UNAVAILABLE[name] = str(err)
        return None


def unavailable_kernels() -> dict[str, str]:
    """The ops whose CUDA kernel could not be loaded (so far), each with the reason: those serve
    CUDA tensors by their reference."""
    return dict(_UNAVAILABLE)


def _lazy_kernel(name: str, cuda: Callable[[], ModuleType], reference: Callable[..., None]) -> Callable[..., None]:
    resolved: list[Callable[..., None]] = []

    @functools.wraps(reference)
    def kernel(*args, **kwargs) -> None:
        if not resolved:
            module = _load(cuda, name)
            resolved.append(getattr(module, name) if module else reference)
        # Kernels launch on the current device's current stream: make that the inputs' device.
        with torch.cuda.device(args[0].device):
            resolved[0](*args, **kwargs)

    return kernel


def _warm_kernels(cuda: Callable[[], ModuleType], device: torch.device) -> None:
    """A kernel module's own warm-up, where it has one: ``warm_triton(device)`` (its Triton launches
    at the decode shapes, which ``build_kernels`` compiles ahead of time), then ``warm(device)``
    (workspaces, first calls); the CuTe DSL kernels' catalogs load before the hooks run."""
    if device.type == "cuda" and (module := _load(cuda)) is not None:
        for hook in ("warm_triton", "warm"):
            if hasattr(module, hook):
                getattr(module, hook)(device)


def registered_ops() -> dict[str, object]:
    """Name -> ``torch.ops.sparse_decode.<name>`` for every registered op."""
    return {name: getattr(torch.ops.sparse_decode, name) for name in _OPS}


def _checked(fn: Callable[..., None], check: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args, **kwargs):
        check(*args, **kwargs)
        fn(*args, **kwargs)

    return run


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the ops.


def check_tensor(
    t: object,
    name: str,
    *,
    dtypes: Iterable[torch.dtype],
    ndim: int,
    contiguous: bool = True,
    inner_contiguous: bool = False,
) -> torch.Tensor:
    """Type, dtype, rank and layout of one tensor argument; raises naming ``name``."""
    check_is_tensor(t, name)
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {tuple(t.stride())})")
    if inner_contiguous and ndim > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension (strides {tuple(t.stride())})")
    return t


def check_is_tensor(t: object, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_shape(t: torch.Tensor, name: str, shape: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_same_device(reference: torch.Tensor, ref_name: str, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != reference.device:
            raise ValueError(f"{name} must be on {ref_name}'s device {reference.device}, got {t.device}")


def check_scalar(value: object, name: str, kind: type) -> None:
    """``kind`` is int, float, bool or str; bool never passes as a number (nor a number as a bool).
    Integers of any integral type pass as ints (numpy's too); the wrappers convert them with
    ``check_int`` before calling an op, whose schema takes a Python int."""
    accepted = {int: (numbers.Integral, torch.SymInt), float: (numbers.Real, torch.SymFloat), bool: (bool,),
                str: (str,)}[kind]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
        raise TypeError(f"{name} must be {'an' if kind is int else 'a'} {kind.__name__}, got {type(value).__name__}")


def check_int(value: object, name: str, low: int, high: int) -> int:
    """``value`` as a Python int in [low, high], or a TypeError / ValueError naming ``name``."""
    check_scalar(value, name, int)
    if isinstance(value, torch.SymInt):
        return value
    value = operator.index(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes of memory that ``t``'s elements occupy (a superset for strided views)."""
    reach = [(size - 1) * stride for size, stride in zip(t.shape, t.stride())]
    item = t.element_size()
    first = t.data_ptr() + sum(r for r in reach if r < 0) * item
    return first, first + (sum(abs(r) for r in reach) + 1) * item


_OVERLAP_VISITS = 1 << 14  # blocks _touches looks at before it calls a strange layout overlapping


def _dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """``t``'s dimensions as (size, byte stride), largest stride first, without the ones that
    repeat no element (size 1, stride 0)."""
    item = t.element_size()
    return sorted(((n, s * item) for n, s in zip(t.shape, t.stride()) if n > 1 and s != 0), key=lambda d: -d[1])


def _touches(t: torch.Tensor, lo: int, hi: int) -> bool:
    """Whether an element of ``t`` occupies a byte of [lo, hi): exact, by walking ``t``'s
    dimensions from the largest stride and skipping every block that lies wholly outside or
    wholly inside the range (for a layout whose blocks do not interleave, at most two a
    dimension). A layout that needs more than _OVERLAP_VISITS blocks counts as touching."""
    item, dims = t.element_size(), _dims(t)
    reach = [item] * (len(dims) + 1)  # reach[k]: bytes from a block's first element to its end, dims k..
    for k in range(len(dims) - 1, -1, -1):
        reach[k] = reach[k + 1] + (dims[k][0] - 1) * dims[k][1]
    visits = 0

    def block(offset: int, k: int) -> bool:
        nonlocal visits
        visits += 1
        end = offset + reach[k]
        if end <= lo or offset >= hi:
            return False
        if (lo <= offset and end <= hi) or k == len(dims) or visits > _OVERLAP_VISITS:
            return True
        n, stride = dims[k]
        first = max(0, -(-(lo - offset - reach[k + 1] + 1) // stride))
        last = min(n - 1, (hi - 1 - offset) // stride)
        return any(block(offset + i * stride, k + 1) for i in range(first, last + 1))

    return block(t.data_ptr(), 0)


def _runs(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """The byte ranges of ``t``'s contiguous runs (its dense inner dimensions), or None when
    there are more than _OVERLAP_VISITS of them."""
    dims = _dims(t)
    run = t.element_size()
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    starts = [t.data_ptr()]
    for n, stride in dims:
        if len(starts) * n > _OVERLAP_VISITS:
            return None
        starts = [s + i * stride for s in starts for i in range(n)]
    return [(s, s + run) for s in starts]


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share a byte (exact; every output is contiguous, one run)."""
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    runs = _runs(a)
    if runs is None:
        runs, b = _runs(b), a
    return True if runs is None else any(_touches(b, lo, hi) for lo, hi in runs)


def check_output(t: torch.Tensor, name: str, dtype: torch.dtype, shape: Sequence[int], like: torch.Tensor,
                 like_name: str) -> torch.Tensor:
    """An output tensor of ``dtype`` and ``shape`` on ``like``'s device."""
    check_tensor(t, name, dtypes=(dtype,), ndim=len(shape))
    check_shape(t, name, shape)
    check_same_device(like, like_name, **{name: t})
    return t


def check_table(table: torch.Tensor, name: str, like: torch.Tensor, like_name: str, per_entry: int,
                unit: str) -> None:
    """An int32 lookup table with a row per row of ``like`` and an entry per ``per_entry``
    columns of it (a page table: pages of ``page_size``; a block table: blocks), on its device."""
    check_tensor(table, name, dtypes=INT32, ndim=2, contiguous=False, inner_contiguous=True)
    rows, width = like.shape
    entries = -(-width // per_entry)
    if table.shape[0] != rows or table.shape[1] < entries:
        raise ValueError(f"{name} must have {rows} rows of at least {entries} {unit} of {per_entry}: it must cover "
                         f"the {width} columns of {like_name}, got {tuple(table.shape)}")
    check_same_device(like, like_name, **{name: table})


def check_no_overlap(outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> None:
    """No output shares a byte of memory with another output or with an input (an op writes its
    outputs in any order, so an alias would give a wrong answer); tensors that interleave in one
    buffer without sharing an element pass. Skipped for tensors without storage (the fake
    tensors of ``torch.compile`` tracing) and empty ones."""
    def real(t):
        return t.numel() > 0 and t.device.type != "meta" and not torch._subclasses.fake_tensor.is_fake(t)

    named = [(n, t) for n, t in outputs.items() if real(t)]
    others = [(n, t) for n, t in inputs.items() if isinstance(t, torch.Tensor) and real(t)]
    for i, (a, ta) in enumerate(named):
        for b, tb in named[i + 1:] + others:
            if _overlap(ta, tb):
                raise ValueError(f"{a} must not overlap {b} in memory")


INT32 = (torch.int32,)


def check_lengths(lengths: object, name: str, rows: int) -> torch.Tensor:
    check_tensor(lengths, name, dtypes=INT32, ndim=1)
    check_shape(lengths, name, (rows,))
    return lengths


def check_rows(rows: int, name: str) -> None:
    if rows > TOPK_MAX_ROWS:
        raise ValueError(f"{name} may have at most {TOPK_MAX_ROWS} rows, got {rows}")


def check_topk_rows(scores, scores_name, dtypes, lengths, k, out, row_starts=None) -> None:
    """The arguments the top-k ops share: scores [rows, width], lengths [rows], k, out [rows, k],
    and the optional row_starts [rows]."""
    check_int(k, "k", 1, TOPK_MAX_K)
    check_tensor(scores, scores_name, dtypes=dtypes, ndim=2, contiguous=False, inner_contiguous=True)
    rows, width = scores.shape
    if width > TOPK_MAX_WIDTH:
        raise ValueError(f"{scores_name} may have at most {TOPK_MAX_WIDTH} columns, got {width}")
    check_rows(rows, scores_name)
    check_lengths(lengths, "lengths", rows)
    check_tensor(out, "out", dtypes=INT32, ndim=2)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows (one per {scores_name} row), got {out.shape[0]}")
    if out.shape[1] != k:
        raise ValueError(f"out must have k = {k} columns, got {out.shape[1]}")
    check_same_device(scores, scores_name, lengths=lengths, out=out)
    inputs = {scores_name: scores, "lengths": lengths}
    if row_starts is not None:
        check_lengths(row_starts, "row_starts", rows)
        check_same_device(scores, scores_name, row_starts=row_starts)
        inputs["row_starts"] = row_starts
    check_no_overlap({"out": out}, inputs)


def topk_out(like: object, name: str, k: int) -> torch.Tensor:
    """The top-k wrappers' output when the caller passes none: int32 [rows of ``like``, k]."""
    check_is_tensor(like, name)
    rows = like.shape[0] if like.dim() >= 1 else 0
    return torch.empty(rows, k, dtype=torch.int32, device=like.device)


# ---------------------------------------------------------------------------------------------
# Warm-up hooks: kernels register how to compile themselves before CUDA graph capture.

_WARMUPS: list[Callable[[torch.device], None]] = []


def register_warmup(fn: Callable[[torch.device], None]) -> Callable[[torch.device], None]:
    """Decorator: ``fn(device)`` compiles and runs a kernel once; ``warmup()`` calls every hook."""
    _WARMUPS.append(fn)
    return fn


def run_warmups(device: torch.device) -> int:
    for fn in _WARMUPS:
        fn(device)
    return len(_WARMUPS)
