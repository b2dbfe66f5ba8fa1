"""Top-k engine versions side by side, in one process: this checkout's ``kernels/topk`` package
against other copies of it, e.g. an earlier commit's, so a change is judged on the same GPU,
clocks and inputs as what it replaces. A copy is a folder (or, from before the package, a copy of
the single file ``kernels/topk_engine.py``) whose relative imports resolve in this checkout's
``kernels`` package.

    git archive REV torch_sparse_decode/kernels/topk | tar -x --strip-components=3 -C .device/scratch/topk_REV
    python benchmarks/compare_topk.py .device/scratch/topk_REV [...] [--quick | --shapes S [S ...]]
        [--rounds R] [--dist D [D ...]] [--results FILE]

``--shapes``: other shapes than SHAPES, each WHAT:ROWSxWIDTH[:BLOCK] with WHAT tokens, blocks or
ord16 and the width in K columns, e.g. ``blocks:64x1024:64 tokens:8x128``.

Every version runs every shape on the same inputs; a version whose ids differ from this
checkout's on a shape is marked there (the GPU tests are what prove exactness). A copy's kernels
are keyed in the disk cache by the copy's own files, so no version loads another's build. With
--rounds R, the versions take turns R times per shape and each cell is the median of its R times:
one run's spread between identical versions reached ~2% at 64 x 1M, more than some changes.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys

import torch

from harness import Table, graph_us, parser, rotation
from torch_sparse_decode.kernels import topk as current
from torch_sparse_decode.ops.select_candidate_blocks.kernel import block_keys

K = 2048
SHAPES = [  # (what, rows, width, block_size)
    ("tokens", 8, 128 << 10, 1), ("tokens", 64, 128 << 10, 1), ("tokens", 8, 1 << 20, 1), ("tokens", 64, 1 << 20, 1),
    ("blocks", 8, 128 << 10, 64), ("blocks", 64, 1 << 20, 8), ("ord16", 1, 64 << 10, 1), ("ord16", 32, 64 << 10, 1),
]
QUICK = [SHAPES[0], SHAPES[3], SHAPES[6]]


def shape_of(text: str) -> tuple[str, int, int, int]:
    """A --shapes entry, WHAT:ROWSxWIDTH[:BLOCK] (width in K columns), as a SHAPES tuple."""
    what, size, *block = text.split(":")
    rows, width = (int(v) for v in size.lower().split("x"))
    if what not in ("tokens", "blocks", "ord16") or len(block) > 1:
        raise ValueError(f"--shapes: {text!r} is not WHAT:ROWSxWIDTH[:BLOCK] with WHAT tokens, blocks or ord16")
    return what, rows, width << 10, int(block[0]) if block else (64 if what == "blocks" else 1)


def load(path: str):
    """A copy of the engine as a package (a folder) or module (a file) of ``kernels``, read from its
    own files (Triton and CuTe DSL read a kernel's source there)."""
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0].replace("-", "_").replace(".", "_")
    name = "torch_sparse_decode.kernels.cmp_" + stem
    folder = os.path.isdir(path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py") if folder else path,
                                                  submodule_search_locations=[path] if folder else None)
    module = importlib.util.module_from_spec(spec)
    if not folder:
        module.__package__ = "torch_sparse_decode.kernels"  # its relative imports
    sys.modules[name] = module  # the package's own relative imports find it
    spec.loader.exec_module(module)
    return module


def caller(engine, what: str, block_size: int, sets, out):
    if what == "tokens":
        return lambda i: engine.select(*sets[i % len(sets)], sets[0][0].shape[1], 1, K, out, pinned=False)
    if what == "ord16":
        return lambda i: engine.select_ord16(*sets[i % len(sets)], K, out)

    def blocks(i):
        logits, lengths = sets[i % len(sets)]
        keys = block_keys(logits, lengths, block_size, keep_all=K)
        engine.select(keys, lengths, logits.shape[1], block_size, K - 1, out, pinned=True)

    return blocks


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("versions", nargs="+", help="copies of kernels/topk (folders) to time beside this checkout's")
    cli.add_argument("--rounds", type=int, default=1, help="turns each version takes per shape (median)")
    cli.add_argument("--shapes", nargs="+", type=shape_of, help="WHAT:ROWSxWIDTH[:BLOCK], width in K columns")
    args = cli.parse_args()
    engines = {"this checkout": current} | {os.path.basename(p): load(p) for p in args.versions}
    table = Table(f"Top-k engine versions, k = {K} (us per call, engine called directly)",
                  ["shape", *engines, "ids differ from this checkout"])
    for what, rows, width, block_size in args.shapes or (QUICK if args.quick else SHAPES):
        def make(seed: int, rows=rows, width=width):
            gen = torch.Generator(device="cuda").manual_seed(seed)
            x = torch.randn(rows, width, device="cuda", generator=gen)
            return x, torch.full((rows,), width, dtype=torch.int32, device="cuda")

        sets = rotation(make, rows * width * 4)
        calls, ids = {}, {}
        for name, engine in engines.items():
            out = torch.full((rows, K), -7, dtype=torch.int32, device="cuda")
            calls[name] = caller(engine, what, block_size, sets, out)
            calls[name](0)
            ids[name] = out.clone()
        rounds = [[graph_us(call) for call in calls.values()] for _ in range(max(args.rounds, 1))]
        times = [statistics.median(column) for column in zip(*rounds)]
        differ = [name for name in engines if not torch.equal(ids[name], ids["this checkout"])]
        shape = f"{what} {rows}x{width >> 10}K" + (f" bs={block_size}" if what == "blocks" else "")
        table.add(shape, *times, ", ".join(differ) or "none")
    table.emit(args.results)


if __name__ == "__main__":
    main()
