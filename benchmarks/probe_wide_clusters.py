"""The short-row select's cluster builds side by side: each shape's rows through the build the op
takes and through others (``short_row.WIDE_BUILDS`` of one build for rows past SHORT_MAX key
columns, ``CLUSTER_SIZES`` for the rest), in one process, ids compared with the op's on every
input set ("wrong" where they differ), timed in CUDA graphs of 20 calls, inputs rotated.

    python benchmarks/probe_wide_clusters.py [--shapes 8x32K,64x32K] [--kinds randn,ragged,ties]
        [--builds 2x1024,16x512] [--clusters 8,4,2] [--results FILE]

A build that cannot hold the shape's rows, or whose clusters do not all fit the SMs, sends the batch
to the engine (its row times the engine); a cluster that cannot be scheduled reads as its error. At 2026-12-07 (H100,
18cb34f) clusters of 16 measured slower at every width, clusters of 8 at 8K-16K columns too, and 2
CTAs of 1024 threads faster than the engine at 64 x 32K (``short_row.WIDE_BUILDS``).
"""

from __future__ import annotations

import contextlib

import torch

from bench_topk import short_rows
from harness import Table, graph_us, parser, switched

K = 2048
SHAPES = "1x8K,8x8K,8x32K,64x32K,8x64K,1x128K,8x128K"
QUICK = "8x32K,64x32K"


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--shapes", default=None, help=f"ROWSxWIDTH in K columns, comma-separated (default {SHAPES})")
    cli.add_argument("--kinds", default="randn,ragged,ties")
    cli.add_argument("--builds", default="16x1024,16x512,2x1024", help="CTAsxTHREADS wide builds to try")
    cli.add_argument("--clusters", default="8,4,2", help="CLUSTER_SIZES to try for rows of <= SHORT_MAX")
    args = cli.parse_args()
    import torch_sparse_decode  # noqa: F401  (registers the ops)
    from torch_sparse_decode.kernels.topk import short_row

    builds = [tuple(int(v) for v in b.split("x")) for b in args.builds.split(",") if b]
    clusters = tuple(int(c) for c in args.clusters.split(",") if c)
    topk = torch.ops.sparse_decode.indexer_topk
    table = Table(f"short-row cluster builds, indexer_topk k = {K}, fp32 (us)",
                  ["shape", "input", "op's build", "build", "time", "ids"])
    shapes = args.shapes or (QUICK if args.quick else SHAPES)
    for shape in shapes.split(","):
        rows, width = shape.lower().split("x")
        rows, width = int(rows), int(width.rstrip("k")) << 10
        for kind in args.kinds.split(","):
            sets = short_rows(rows, width, kind)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")

            def ids(s):
                topk(*s, K, out)
                return out.clone()

            want = [ids(s) for s in sets]
            table.add(shape, kind, "(the op's)", "", graph_us(lambda i: topk(*sets[i % len(sets)], K, out)), "")
            if width > short_row.SHORT_MAX:
                variants = [(f"{c} x {t}", [switched(short_row, "WIDE_BUILDS", ((c, t),)),
                                            switched(short_row, "WIDE_MAX", max(c * t * short_row.PER, width))])
                            for c, t in builds]
            else:
                variants = [(f"clusters {clusters}", [switched(short_row, "CLUSTER_SIZES", clusters)])]
            for name, switches in variants:
                try:
                    with contextlib.ExitStack() as stack:
                        for s in switches:
                            stack.enter_context(s)
                        exact = all(torch.equal(ids(s), w) for s, w in zip(sets, want))
                        took = graph_us(lambda i: topk(*sets[i % len(sets)], K, out))
                    table.add(shape, kind, "", name, took, "same" if exact else "wrong")
                except Exception as e:  # a cluster that cannot be scheduled
                    table.add(shape, kind, "", name, f"{type(e).__name__}: {str(e)[:80]}", "")
                    torch.cuda.synchronize()
    table.emit(args.results)


if __name__ == "__main__":
    main()
