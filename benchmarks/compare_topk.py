"""Top-k engine versions side by side, in one process (SPEC 3 timing): this checkout's
``kernels/topk.py`` against other copies of that file, e.g. an earlier commit's, so a change is
judged on the same GPU, clocks and inputs as what it replaces.

    git show REV:torch_sparse_decode/kernels/topk.py > .device/scratch/topk_REV.py   # here
    python benchmarks/compare_topk.py .device/scratch/topk_REV.py [...] [--quick] [--rounds R] [--results FILE]

Every version runs every shape on the same inputs; a version whose ids differ from this
checkout's on a shape is marked there (the GPU tests are what prove exactness). With --rounds R,
the versions take turns R times per shape and each cell is the median of its R times: one run's
spread between identical versions reached ~2% at 64 x 1M (session 8), more than some changes.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import tempfile

import torch

from harness import Table, graph_us, parser, rotation
from torch_sparse_decode.kernels import topk as current

K = 2048
SHAPES = [  # (what, rows, width, block_size)
    ("tokens", 8, 128 << 10, 1), ("tokens", 64, 128 << 10, 1), ("tokens", 8, 1 << 20, 1), ("tokens", 64, 1 << 20, 1),
    ("blocks", 8, 128 << 10, 64), ("blocks", 64, 1 << 20, 8), ("ord16", 1, 64 << 10, 1), ("ord16", 32, 64 << 10, 1),
]
QUICK = [SHAPES[0], SHAPES[3], SHAPES[6]]


def load(path: str):
    """A copy of kernels/topk.py as its own module, from a file beside it with the relative import
    made absolute (Triton and CuTe DSL read a kernel's source from its file)."""
    with open(path) as f:
        source = f.read().replace("from .cute_helpers import", "from torch_sparse_decode.kernels.cute_helpers import")
    name = "cmp_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_").replace(".", "_")
    copy = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(copy, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def caller(engine, what: str, block_size: int, sets, out):
    if what == "tokens":
        return lambda i: engine.indexer_topk(*sets[i % len(sets)], K, out)
    if what == "ord16":
        return lambda i: engine.select_ord16(*sets[i % len(sets)], K, out)
    return lambda i: engine.select_candidate_blocks(*sets[i % len(sets)], block_size, out)


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("versions", nargs="+", help="copies of kernels/topk.py to time beside this checkout's")
    cli.add_argument("--rounds", type=int, default=1, help="turns each version takes per shape (median)")
    args = cli.parse_args()
    engines = {"this checkout": current} | {os.path.basename(p): load(p) for p in args.versions}
    table = Table(f"Top-k engine versions, k = {K} (us per call, engine called directly)",
                  ["shape", *engines, "ids differ from this checkout"])
    for what, rows, width, block_size in QUICK if args.quick else SHAPES:
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
