"""Build the CuTe DSL kernels ahead of time, on a machine with or without a GPU.

    python -m torch_sparse_decode.build_kernels --arch sm_90a [--arch sm_100a] --out DIR
        [--sms N ...] [--route E,K[,G,KG[,H]] ...] [--jobs N] [--kernels NAME,...] [--one-per-kernel]
        [--no-triton]
    python -m torch_sparse_decode.build_kernels --arch sm_90a --ptx DIR [--kernels NAME,...]

For each architecture it compiles every kernel's catalog (the configurations ``warmup()`` loads:
``cached_kernel(name, catalog)`` beside each kernel) into DIR, in parallel over the cores, with
a line per kernel and a summary (count, size, time). Objects already in DIR are kept.

- the top-k engine: every configuration (``indexer_topk``, ``select_candidate_blocks``, their
  fused forms and the DCP pack's local select);
- the DCP merge at W = 2, 4, 8 and K = 2048, simulated and in a step;
- ``moe_route`` and the router front for the models in ``compile.MODELS`` (DeepSeek-V3 / V3.2,
  Kimi-K2, Kimi-K3, 512 / 22 and 1024 / 32) and each ``--route E,K[,G,KG[,H]]`` (experts, top
  k, expert groups and groups kept, hidden width). The front's grid follows the GPU's SM count:
  ``--sms`` (by default 132 for sm_90a, H100 SXM and H200, and 148 for sm_100a, B200).

A process started with ``TORCH_SPARSE_DECODE_CACHE=DIR`` loads these instead of compiling them;
whatever is not in DIR still compiles on first use. An object's key names the kernel's source,
the CuTe DSL and TVM-FFI versions, the architecture and the configuration (``kernels/compile.py``),
so an object built here for sm_90a is the one an H100 or H200 loads, and a stale one never is.

``--ptx DIR`` builds no objects: it compiles each configuration afresh and keeps its PTX in DIR,
the kernel's entry name (which spells the module path of its class) replaced by ``KERNEL``, with a
``manifest.txt`` of their sha256. Two trees whose manifests agree compile to the same code: how a
refactor shows that the shipped kernels' PTX did not change.

The Triton kernels (the block-key pass, the DCP pack, ``decode_row_lengths``) are compiled too,
at the launches ``warmup()`` makes, into ``DIR/triton/<identity>`` (``kernels/triton_cache``):
Triton's cache names Triton itself, so build with the Triton (and Python) of the environment
that will serve; ``warmup()`` copies the entries for its Triton into Triton's cache folder.
``--no-triton`` skips them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

JOBS_ENV = "TORCH_SPARSE_DECODE_COMPILE_JOBS"  # processes warmup() compiles with (1: in its own)
BUILD_TIMEOUT_S = 3600  # warmup()'s bound on the parallel build; past it, the process compiles what is left


@dataclass(frozen=True)
class Job:
    arch: str
    module: str  # where the kernel is defined (imported by the worker)
    kernel: str
    config: tuple


@dataclass(frozen=True)
class Built:
    job: Job
    seconds: float  # 0 when the object was already there
    bytes: int
    digest: str = ""  # --ptx: the sha256 of the PTX


def plan(archs: list[str], sms: dict[str, list[int]], models: tuple, kernels: list[str] | None = None,
         one_per_kernel: bool = False) -> list[Job]:
    """Every catalog configuration of ``kernels`` (default: all) for each architecture, each
    once; the engine's first (they take longest)."""
    from .kernels.compile import Target, import_kernels

    every = import_kernels()
    unknown = set(kernels or ()) - set(every)
    if unknown:
        raise ValueError(f"--kernels: no kernel named {', '.join(sorted(unknown))} (there are {', '.join(every)})")
    jobs: dict[Job, None] = {}
    for arch in archs:
        for kernel in (every[name] for name in kernels or every):
            configs = [c for count in sms[arch] for c in kernel.catalog(Target(arch, count, models))]
            for config in list(dict.fromkeys(configs))[:1 if one_per_kernel else None]:
                jobs[Job(arch, kernel.build.__module__, kernel.name, config)] = None
    return sorted(jobs, key=lambda job: (archs.index(job.arch), job.kernel != "topk_engine"))


def _start_worker(arch: str, out: str, ptx: bool = False) -> None:
    os.environ["CUTE_DSL_ARCH"] = arch  # before the DSL is imported: it reads it once
    os.environ["TORCH_SPARSE_DECODE_CACHE"] = out
    if ptx:
        os.environ["CUTE_DSL_KEEP"] = "ptx"


def _start_fill_worker(arch: str, out: str) -> None:
    _start_worker(arch, out)
    os.environ.pop("TRITON_INTERPRET", None)  # before Triton is imported: the interpreter compiles nothing


def _build(job: Job) -> Built:
    """In a worker: compile ``job`` into the cache folder unless its object is there."""
    importlib.import_module(job.module)
    from .kernels.compile import KERNELS, target_arch

    if target_arch() != job.arch:
        raise RuntimeError(f"a worker for {job.arch} compiles for {target_arch()}")

    kernel = KERNELS[job.kernel]
    path, _ = kernel.entry(job.config)
    if path.exists():
        return Built(job, 0.0, path.stat().st_size)
    start = time.perf_counter()
    kernel(*job.config)
    if not path.exists():
        raise RuntimeError(f"{job.kernel} {job.config}: compiled, but {path} could not be written")
    return Built(job, time.perf_counter() - start, path.stat().st_size)


def kernel_ptx(module: str, kernel: str, config: tuple) -> str:
    """The PTX of one configuration of a cached kernel, compiled afresh (the DSL must have been
    imported with ``CUTE_DSL_KEEP=ptx``: ``--ptx`` workers, ``benchmarks/sass_count.py``)."""
    import tempfile

    importlib.import_module(module)
    from .kernels.compile import KERNELS, _dsl

    with tempfile.TemporaryDirectory() as dump:
        _dsl().envar.dump_dir = dump
        KERNELS[kernel].build(*config)
        (ptx,) = Path(dump).glob("*.ptx")
        return ptx.read_text()


def _ptx(job: Job) -> Built:
    """In a worker started for ``--ptx``: compile ``job`` afresh, keep its PTX (the entry's name
    replaced) in the cache folder."""
    import hashlib
    import re

    from .kernels.compile import cache_dir

    text = kernel_ptx(job.module, job.kernel, job.config)
    text = text.replace(re.search(r"\.entry (\w+)\(", text).group(1), "KERNEL")
    tag = hashlib.sha256(repr(job.config).encode()).hexdigest()[:12]
    (cache_dir() / f"{job.arch}-{job.kernel}-{tag}.ptx").write_text(text)
    return Built(job, 0.0, len(text), hashlib.sha256(text.encode()).hexdigest())


def _fill_triton(arch: str, out: str) -> tuple[int, int, str]:
    """In a worker: Triton's cache for ``arch`` under ``out`` (kernels, launchers, identity)."""
    from ._library import cuda_kernels
    from .kernels import triton_cache

    kernels, launchers = triton_cache.fill(Path(out), arch, sorted(set(cuda_kernels().values())))
    return kernels, launchers, triton_cache.identity()


def fill_triton(archs: list[str], out: Path, log=print) -> None:
    """Fill Triton's cache in ``out`` for each architecture, in a fresh process each (the fill
    points Triton at a GPU that is not there)."""
    import triton

    context = multiprocessing.get_context("spawn")
    for arch in archs:
        start = time.perf_counter()
        with ProcessPoolExecutor(1, context, _start_fill_worker, (arch, str(out))) as pool:
            kernels, launchers, identity = pool.submit(_fill_triton, arch, str(out)).result()
        log(f"Triton {triton.__version__}: {kernels} kernels for {arch} in {time.perf_counter() - start:.0f} s "
            f"({launchers} host launchers), in {out / 'triton' / identity}")


def _describe(config: tuple) -> str:
    return "(" + ", ".join(str(v).removeprefix("torch.") for v in config) + ")"


def build(jobs: list[Job], out: Path, processes: int, log=print, ptx: bool = False) -> list[Built]:
    """Run ``jobs`` over ``processes`` worker processes per architecture, logging each (``ptx``:
    their PTX instead of objects)."""
    out.mkdir(parents=True, exist_ok=True)
    done: list[Built] = []
    for arch in dict.fromkeys(job.arch for job in jobs):
        mine = [job for job in jobs if job.arch == arch]
        context = multiprocessing.get_context("spawn")  # a fresh DSL per worker, for this arch
        start = (arch, str(out), ptx)
        with ProcessPoolExecutor(min(processes, len(mine)), context, _start_worker, start) as pool:
            for future in as_completed([pool.submit(_ptx if ptx else _build, job) for job in mine]):
                built = future.result()
                done.append(built)
                job = built.job
                took = built.digest[:12] if ptx else f"{built.seconds:5.1f} s" if built.seconds else "   there"
                log(f"[{len(done)}/{len(jobs)}] {arch} {took}  {job.kernel} {_describe(job.config)}")
    return done


def _route(text: str):
    from .kernels.compile import RoutedModel

    numbers = [int(v) for v in text.split(",")]
    if not 2 <= len(numbers) <= 5 or len(numbers) == 3:
        raise argparse.ArgumentTypeError(f"--route {text!r}: expected E,K or E,K,G,KG or E,K,G,KG,H")
    return RoutedModel(f"--route {text}", *numbers)


def main(argv: list[str] | None = None) -> int:
    from .kernels.compile import DEFAULT_SMS, MODELS

    cli = argparse.ArgumentParser(prog="python -m torch_sparse_decode.build_kernels",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--arch", action="append", required=True, help="sm_90a, sm_100a, ... (repeatable)")
    where = cli.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="the cache folder (TORCH_SPARSE_DECODE_CACHE)")
    where.add_argument("--ptx", type=Path, help="keep each configuration's PTX and a manifest here instead")
    cli.add_argument("--sms", type=int, action="append", help="SM counts to build the router front for")
    cli.add_argument("--route", type=_route, action="append", default=[], help="another routing: E,K[,G,KG[,H]]")
    cli.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="worker processes")
    cli.add_argument("--kernels", type=lambda text: text.split(","), help="these kernels only (comma-separated)")
    cli.add_argument("--one-per-kernel", action="store_true", help="each kernel's first configuration only")
    cli.add_argument("--no-triton", action="store_true", help="leave the Triton kernels to their first launch")
    cli.add_argument("--quiet", action="store_true", help="the summary only")
    args = cli.parse_args(argv)
    unknown = [arch for arch in args.arch if arch not in DEFAULT_SMS]
    if unknown and not args.sms:
        cli.error(f"--sms: give the SM count of the GPUs for {', '.join(unknown)} (the router front's grid follows it)")
    sms = {arch: args.sms or list(DEFAULT_SMS[arch]) for arch in args.arch}
    start = time.perf_counter()
    jobs = plan(args.arch, sms, MODELS + tuple(args.route), args.kernels, args.one_per_kernel)
    log = (lambda line: None) if args.quiet else print
    if args.ptx:
        done = build(jobs, args.ptx, max(args.jobs, 1), log, ptx=True)
        lines = sorted(f"{b.digest}  {b.job.arch} {b.job.kernel} {_describe(b.job.config)}" for b in done)
        (args.ptx / "manifest.txt").write_text("\n".join(lines) + "\n")
        print(f"PTX of {len(done)} configurations in {args.ptx} ({args.ptx / 'manifest.txt'})")
        return 0
    done = build(jobs, args.out, max(args.jobs, 1), log)
    fresh = [b for b in done if b.seconds]
    size = sum(b.bytes for b in done)
    print(f"built {len(fresh)} kernel objects for {', '.join(args.arch)} in {time.perf_counter() - start:.0f} s "
          f"on {min(args.jobs, len(jobs))} processes ({sum(b.seconds for b in fresh):.0f} s of compiling); "
          f"{len(done) - len(fresh)} were already there; {len(done)} objects, {size / 2**20:.1f} MiB in {args.out}")
    if not args.no_triton and not args.kernels:
        fill_triton(args.arch, args.out)
    return 0


def compile_jobs() -> int:
    """Processes ``warmup()`` compiles missing kernels with: $TORCH_SPARSE_DECODE_COMPILE_JOBS,
    else the cores this process may use."""
    return int(os.environ.get(JOBS_ENV) or len(os.sched_getaffinity(0)))


def warm_catalogs(device) -> int:
    """Load every catalog configuration for ``device`` (a CUDA device); first compile the
    missing ones into the disk cache in parallel (this module, in a subprocess that never
    touches the GPU), and copy the folder's Triton kernels into Triton's cache. Returns the
    configurations loaded."""
    try:
        from .kernels.compile import cache_dir, device_target, import_kernels
    except ImportError:  # no CuTe DSL: the ops warn and serve CUDA tensors by their reference
        return 0
    with contextlib.suppress(ImportError):
        from .kernels.triton_cache import seed

        seed(cache_dir())
    target = device_target(device)
    todo = [(kernel, config) for kernel in import_kernels().values() for config in kernel.catalog(target)]
    folder = cache_dir()
    missing = [kernel.name for kernel, config in todo if folder is not None and not kernel.entry(config)[0].exists()]
    processes = min(compile_jobs(), len(missing))
    if processes > 1:
        command = [sys.executable, "-m", __name__, "--arch", target.arch, "--sms", str(target.sms),
                   "--out", str(folder), "--jobs", str(processes), "--kernels", ",".join(dict.fromkeys(missing)),
                   "--no-triton", "--quiet"]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            failure = result.stderr[-2000:] if result.returncode != 0 else ""
        except subprocess.TimeoutExpired:
            failure = f"no result within {BUILD_TIMEOUT_S} s"
        if failure:  # compile what is left here instead, one at a time
            import warnings

            warnings.warn(f"torch_sparse_decode: the parallel kernel build failed ({failure}); "
                          "compiling in this process")
    for kernel, config in todo:
        kernel(*config)
    return len(todo)


if __name__ == "__main__":
    sys.exit(main())
