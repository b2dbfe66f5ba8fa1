"""Each top-k op's time against the row length, beside torch.topk and the one-read floor: a
table (CSV) measured on the GPU, and a plot drawn from it (PNG, with matplotlib).

    python benchmarks/plot_topk.py --csv topk_vs_length.csv          # measure (GPU)
    python benchmarks/plot_topk.py --draw topk_vs_length.csv --png benchmarks/topk_vs_length.png

k = 2048, 8 rows of random fp32 scores, full-length rows; block selection at block size 64.
Times as in bench_topk.py (CUDA graphs, inputs rotated past L2). The floor is one read of the
valid bytes at the measured copy bandwidth.
"""

from __future__ import annotations

import csv

K = 2048
ROWS = 8
LENGTHS = [1 << p for p in range(13, 21)]  # 8K .. 1M
COLUMNS = ["length", "indexer_topk", "torch.topk", "select_candidate_blocks bs=64", "block max + torch.topk",
           "one-read floor"]


def measure(path: str, results: str) -> None:
    import torch

    import torch_sparse_decode  # noqa: F401  (registers the ops)
    from bench_topk import make_rows
    from harness import Table, floor_bandwidth_tbs, graph_us

    _, bandwidth = floor_bandwidth_tbs()
    out = torch.empty(ROWS, K, dtype=torch.int32, device="cuda")
    rows = []
    for width in LENGTHS:
        sets = make_rows(ROWS, width)

        def blocks_baseline(i):
            maxima = sets[i % len(sets)][0].view(ROWS, width // 64, 64).amax(dim=2)
            return torch.topk(maxima, min(K, maxima.shape[1]), dim=1).indices

        rows.append([
            width,
            graph_us(lambda i: torch.ops.sparse_decode.indexer_topk(*sets[i % len(sets)], K, out)),
            graph_us(lambda i: torch.topk(sets[i % len(sets)][0], min(K, width), dim=1).indices),
            graph_us(lambda i: torch.ops.sparse_decode.select_candidate_blocks(*sets[i % len(sets)], 64, K, out)),
            graph_us(blocks_baseline),
            ROWS * width * 4 / (bandwidth * 1e12) * 1e6,
        ])
    table = Table(f"top-k time against row length, {ROWS} rows, k = {K} (us per call)", COLUMNS)
    for row in rows:
        table.add(*row)
    table.emit(results)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)


def draw(path: str, png: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        table = list(csv.DictReader(f))
    lengths = [int(r["length"]) for r in table]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    styles = {"indexer_topk": "o-", "torch.topk": "o--", "select_candidate_blocks bs=64": "s-",
              "block max + torch.topk": "s--", "one-read floor": "k:"}
    for name, style in styles.items():
        ax.plot(lengths, [float(r[name]) for r in table], style, label=name, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"row length (tokens), {ROWS} rows, k = {K}")
    ax.set_ylabel("us per call (CUDA graph)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    from harness import parser

    p = parser(__doc__)
    p.add_argument("--csv", help="measure on the GPU into this CSV")
    p.add_argument("--draw", help="a CSV to draw")
    p.add_argument("--png", default="topk_vs_length.png")
    p.add_argument("--title", default="top-k time against row length")
    args = p.parse_args()
    if args.csv:
        measure(args.csv, args.results)
    if args.draw:
        draw(args.draw, args.png, args.title)


if __name__ == "__main__":
    main()
