"""The static SASS of the one-CTA short-row kernels and of the routers, on a machine without a
GPU: registers, spills, instructions, and the floor those instructions set.

    python benchmarks/sass_count.py [--results FILE]

A row's select in one CTA of 1024 threads is bound by instruction issue: an SM's 4 schedulers
issue one warp instruction a cycle each, so a CTA of W warps that runs N instructions a thread
takes at least N * W / 4 cycles (C such CTAs over the GPU's S SMs: N * W * C / (4 S)). Each
kernel is compiled for sm_90a from fake tensors (CuTe DSL) or by Triton's compiler, assembled
by the ptxas that ships with Triton and disassembled. The counts are static: a loop counts
once, and a branch not taken or a phase that one warp runs counts for every warp, so the floor
is a guide for comparing designs, not a time. Triton's kernels without loops run every
instruction in every warp: their floor is a real lower bound (``docs/topk_engine.md``,
``docs/ops.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before the DSL is imported: it reads them once
os.environ.setdefault("CUTE_DSL_KEEP", "ptx")
os.environ.pop("TRITON_INTERPRET", None)  # the interpreter compiles nothing

import triton  # noqa: E402
from harness import Table, parser  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))  # the Triton kernels' signatures

CLOCK_GHZ = 1.98  # the H200's SM clock under load (docs/developing.md)
SCHEDULERS = 4
SMS = 132
ROUTE_TOKENS = 4096  # the tile router's row of the table: DeepSeek-V3's routing at prefill size
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
WATCHED = ("LDG", "ATOMS", "BAR", "SHFL", "VOTE", "POPC", "REDUX")


def assemble(ptx: str, folder: str) -> tuple[bytes, int, int]:
    """(cubin, registers, spilled bytes) of ``ptx``; CUDA 13's PTX ISA 9.x is relabelled for Triton's
    ptxas (these kernels use nothing newer than 8.8)."""
    source = os.path.join(folder, "kernel.ptx")
    with open(source, "w") as f:
        f.write(re.sub(r"^\.version 9\.\d+", ".version 8.8", ptx, flags=re.M))
    cubin = os.path.join(folder, "kernel.cubin")
    log = subprocess.run([os.path.join(TOOLS, "ptxas"), "-arch=sm_90a", "-v", source, "-o", cubin],
                         capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spilled = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log))
    with open(cubin, "rb") as f:
        return f.read(), registers, spilled


def opcodes(cubin: bytes, folder: str) -> list[str]:
    """The opcode of each instruction (predicates dropped)."""
    path = os.path.join(folder, "kernel.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                          check=True).stdout
    return re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)", sass, flags=re.M)


def short_row_ptx(dtype: torch.dtype, lean: bool = False) -> str:
    """The short-row select's PTX at 1024 threads, plain or lean (``short_row.LEAN``)."""
    from torch_sparse_decode.build_kernels import kernel_ptx
    from torch_sparse_decode.kernels.topk import short_row

    config = (dtype, False, short_row.THREADS, False, False, lean)
    return kernel_ptx("torch_sparse_decode.kernels.topk.short_row", "topk_short_row", config)


def triton_ptx(fn, signature: dict, constexprs: dict, warps: int, aligned: tuple = ()) -> str:
    from triton.backends.compiler import GPUTarget

    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]


def route_ptx() -> list[tuple[str, str, int, int]]:
    """(name, PTX, warps, CTAs) of the CTA router and the warp router at ROUTE_TOKENS tokens:
    DeepSeek-V3's routing and Kimi-K2's (384 experts, top 8), logits in fp32."""
    from torch_sparse_decode.build_kernels import kernel_ptx
    from torch_sparse_decode.ops.moe_route import kernel, warps

    builds = []
    for model, experts, groups, kept in (("DeepSeek-V3", 256, 8, 4), ("Kimi-K2", 384, 1, 1)):
        config = (experts, 8, True, True, groups, kept, torch.float32, torch.float32, torch.float32, False)
        builds.append((f"moe_route CTA {model}, T = {ROUTE_TOKENS}",
                       kernel_ptx("torch_sparse_decode.ops.moe_route.kernel", "moe_route", config),
                       kernel.WARPS, ROUTE_TOKENS))
        builds.append((f"moe_route warps {model}, T = {ROUTE_TOKENS}",
                       kernel_ptx("torch_sparse_decode.ops.moe_route.warps", "moe_route_warps", config),
                       warps.TOKENS, ROUTE_TOKENS // warps.TOKENS))
    return builds


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table("static SASS of the one-CTA short-row kernels and the routers (sm_90a)",
                  ["kernel", "warps", "CTAs", "registers", "spilled bytes", "instructions", *WATCHED,
                   "issue floor (us)"],
                  timing=f"floor: instructions x warps x CTAs / ({SCHEDULERS} schedulers x min(CTAs, {SMS}) SMs) "
                         f"at {CLOCK_GHZ} GHz")
    with tempfile.TemporaryDirectory() as folder:
        builds = [(f"short_row {str(dtype).split('.')[1]}{', lean' if lean else ''}, a row",
                   short_row_ptx(dtype, lean), 32, 1)
                  for dtype in ((torch.float32,) if args.quick else (torch.float32, torch.bfloat16))
                  for lean in (False, True)]
        if not args.quick:
            builds += route_ptx()
        for name, ptx, warps, ctas in builds:
            cubin, registers, spilled = assemble(ptx, folder)
            ops = opcodes(cubin, folder)
            watched = [sum(op == w or op.startswith(w + "_") for op in ops) for w in WATCHED]
            floor = len(ops) * warps * ctas / (SCHEDULERS * min(ctas, SMS)) / (CLOCK_GHZ * 1e3)
            table.add(name, warps, ctas, registers, spilled, len(ops), *watched, floor)
    table.emit(args.results)


if __name__ == "__main__":
    main()
