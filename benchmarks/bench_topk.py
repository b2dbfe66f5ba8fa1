"""select_candidate_blocks and indexer_topk vs block max + torch.topk / torch.topk, beside the
one-read floor (valid bytes / measured copy bandwidth), all in CUDA graphs (the harness's method).

    python benchmarks/bench_topk.py [--quick] [--dtype float32|bfloat16|float16] [--results FILE]
        [--tables main,windows,fused,short,wide]

``--dtype``: the scores' / logits' dtype (the floor counts its bytes; the baselines run on it too).
``short``: decode's everyday rows (8K and 16K columns) through the engine and the one-CTA
short-row path, switched in the same process, on random, ragged and tie-heavy rows, beside what a
one-CTA kernel that reads each row and writes k ids (no select) takes; its rows of 32K to 128K
columns take clusters of 4 and 8 CTAs (``short_row.WIDE``, switched on there). ``wide``: the
other users' wide rows beside the engine (block selection at block size 8, the DCP pack).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import torch_sparse_decode  # noqa: F401  (registers the ops)
from harness import Table, floor_bandwidth_tbs, graph_us, parser, rotation, switched

K = 2048


@triton.jit
def read_floor(src, src_stride, lengths, out, out_stride, k, BLOCK: tl.constexpr, K_P2: tl.constexpr):
    """The least a one-CTA select of a row does (not a select): read the row's window, one CTA-wide
    reduction, and k ids written that depend on it."""
    row = tl.program_id(0)
    n = tl.load(lengths + row)
    col = tl.arange(0, BLOCK)
    x = tl.load(src + row.to(tl.int64) * src_stride + col, mask=col < n, other=0.0)
    above = tl.sum((x > 0).to(tl.int32), axis=0)
    ids = tl.arange(0, K_P2)
    tl.store(out + row.to(tl.int64) * out_stride + ids, tl.where(ids < above, ids, -1), mask=ids < k)


def launch_read_floor(src: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor) -> None:
    """``read_floor`` over every row, one CTA of 1024 threads a row (as the short paths)."""
    read_floor[(out.shape[0],)](src, src.stride(0), lengths, out, out.stride(0), out.shape[1],
                                BLOCK=triton.next_power_of_2(src.shape[1]), K_P2=triton.next_power_of_2(out.shape[1]),
                                num_warps=32)


def make_rows(rows: int, width: int, dtype=torch.float32):
    def make(seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        logits = torch.randn(rows, width, device="cuda", generator=gen).to(dtype)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        return logits, ends

    return rotation(make, rows * width * dtype.itemsize)


def named(shape: str, dtype) -> str:
    return shape if dtype == torch.float32 else f"{shape} {str(dtype)[6:]}"


def bar(floor_us: float) -> float:
    return 1.5 * floor_us + 4.0


def verdict(ours: float, base: float, floor_us: float, factor: float) -> str:
    fast_enough = base / ours >= factor or base < 40
    return "yes" if ours <= bar(floor_us) and fast_enough else "no"


def bench_blocks(table: Table, bandwidth: float, rows: int, width: int, block_size: int, dtype=torch.float32) -> None:
    sets = make_rows(rows, width, dtype)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    select = torch.ops.sparse_decode.select_candidate_blocks

    def baseline(i):
        logits, _ = sets[i % len(sets)]
        maxima = logits.view(rows, width // block_size, block_size).amax(dim=2)
        return torch.topk(maxima, min(K, maxima.shape[1]), dim=1).indices

    ours = graph_us(lambda i: select(*sets[i % len(sets)], block_size, K, out))
    base = graph_us(baseline)
    floor_us = rows * width * dtype.itemsize / (bandwidth * 1e12) * 1e6
    table.add("select_candidate_blocks", named(f"{rows}x{width >> 10}K bs={block_size}", dtype), ours, base,
              f"{base / ours:.1f}x", floor_us, bar(floor_us), verdict(ours, base, floor_us, 10))


def bench_tokens(table: Table, bandwidth: float, rows: int, width: int, dtype=torch.float32) -> None:
    sets = make_rows(rows, width, dtype)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    topk = torch.ops.sparse_decode.indexer_topk
    ours = graph_us(lambda i: topk(*sets[i % len(sets)], K, out))
    base = graph_us(lambda i: torch.topk(sets[i % len(sets)][0], K, dim=1).indices)
    floor_us = rows * width * dtype.itemsize / (bandwidth * 1e12) * 1e6
    table.add("indexer_topk", named(f"{rows}x{width >> 10}K", dtype), ours, base, f"{base / ours:.1f}x", floor_us,
              bar(floor_us), verdict(ours, base, floor_us, 10))


def bench_windows(table: Table, rows: int, window: int, width: int, block_size: int = 0, align: int = 1) -> None:
    """row_starts: windows of ``window`` columns at random starts (multiples of ``align``) inside
    rows of ``width``, beside plain rows of ``window`` columns (the bar: the same cost) and of
    ``window + 1``: an unaligned window spans as many 16-byte chunks as that longer plain row."""
    gen = torch.Generator().manual_seed(rows + window)
    starts = torch.randint(0, width - window + 1, (rows,), generator=gen, dtype=torch.int32) // align * align
    starts = starts.cuda()
    ends = starts + window
    wide = make_rows(rows, width)
    plain, longer = make_rows(rows, window), make_rows(rows, window + 1)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    if block_size:
        op, name, args = torch.ops.sparse_decode.select_candidate_blocks, f"select_candidate_blocks bs={block_size}", \
            (block_size, K, out)
    else:
        op, name, args = torch.ops.sparse_decode.indexer_topk, "indexer_topk", (K, out)
    windowed = graph_us(lambda i: op(wide[i % len(wide)][0], ends, *args, starts))
    ours, one_more = (graph_us(lambda i, sets=sets: op(*sets[i % len(sets)], *args)) for sets in (plain, longer))
    size = f"{window >> 10}K" if window % 1024 == 0 else f"{window}"
    where = f"{rows} x {size} of {width >> 10}K" + (f", starts % {align} = 0" if align > 1 else "")
    table.add(name, where, windowed, ours, f"{windowed / ours:.2f}", one_more, f"{windowed / one_more:.2f}")


def bench_fused(table: Table, rows: int, width: int, page_size: int = 64) -> None:
    """indexer_topk_fused beside plain indexer_topk on the same rows (the bar: <= 0.5 us more):
    every output (KV slots through a page table, raw ids, values), then each alone."""
    sets = make_rows(rows, width)
    gen = torch.Generator().manual_seed(rows)
    pages = torch.randint(0, 1 << 20, (rows, -(-width // page_size)), generator=gen, dtype=torch.int32).cuda()
    out, ids = (torch.empty(rows, K, dtype=torch.int32, device="cuda") for _ in range(2))
    values = torch.empty(rows, K, device="cuda")
    plain = graph_us(lambda i: torch.ops.sparse_decode.indexer_topk(*sets[i % len(sets)], K, out))
    for what, extra in (("slots + ids + values", (ids, values, pages, page_size)),
                        ("slots", (None, None, pages, page_size)), ("values", (None, values, None, 0))):
        fused = graph_us(lambda i: torch.ops.sparse_decode.indexer_topk_fused(*sets[i % len(sets)], K, out, *extra))
        table.add("indexer_topk_fused", f"{rows}x{width >> 10}K page {page_size}", what, fused, plain,
                  f"{fused - plain:+.2f}", "yes" if fused - plain <= 0.5 else "no")


# The short-row bars (us) where the path's widths meet them: rows x width -> bar.
SHORT_BARS = {(1, 8 << 10): 5.0, (8, 8 << 10): 5.0, (64, 8 << 10): 6.0, (256, 8 << 10): 12.0, (8, 32 << 10): 7.0,
              (64, 32 << 10): 10.0, (256, 32 << 10): 24.0, (1, 128 << 10): 10.0, (8, 128 << 10): 10.0,
              (64, 128 << 10): 16.0}


def short_rows(rows: int, width: int, kind: str, dtype=torch.float32) -> list:
    """Rotated input sets (scores, lengths) of ``kind``: randn at full length, randn at ragged
    lengths (width / 2 to width), or ties (four values)."""

    def make(seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        if kind == "ties":
            x = torch.randint(0, 4, (rows, width), device="cuda", generator=gen).float()
        else:
            x = torch.randn(rows, width, device="cuda", generator=gen)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        if kind == "ragged":
            ends = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=gen, dtype=torch.int32)
        return x.to(dtype), ends

    return rotation(make, rows * width * dtype.itemsize)


def bench_short(table: Table, rows: int, width: int, kind: str, dtype) -> None:
    """indexer_topk on ``kind`` rows (``short_rows``) through the engine and the short-row path,
    beside torch.topk."""
    from torch_sparse_decode.kernels.topk import short_row

    sets = short_rows(rows, width, kind, dtype)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    topk = torch.ops.sparse_decode.indexer_topk
    times = {}
    for path in ("engine", "short"):
        with switched(short_row, "SHORT_ROWS", path == "short"), switched(short_row, "WIDE", True):
            times[path] = graph_us(lambda i: topk(*sets[i % len(sets)], K, out))
    base = graph_us(lambda i: torch.topk(sets[i % len(sets)][0], K, dim=1).indices)
    floor = graph_us(lambda i: launch_read_floor(*sets[i % len(sets)], out))
    bar = SHORT_BARS.get((rows, width))
    short = times["short"]
    table.add(named(f"{rows}x{width >> 10}K", dtype), kind, times["engine"], short,
              f"{times['engine'] / short:.2f}x", floor, base, bar or "",
              "" if bar is None else "yes" if short <= bar else "no")


def bench_wide_users(table: Table, quick: bool) -> None:
    """The short path's other users past SHORT_MAX key columns (``short_row.WIDE``), beside the
    engine: block selection at block size 8 (128K-512K tokens: 16K-64K block keys) and the DCP
    pack at W = 2 (the local select of 64K bf16 scores, ord16 keys, then the pack's writer)."""
    from torch_sparse_decode import dcp
    from torch_sparse_decode.kernels.topk import short_row
    from torch_sparse_decode.ops.dcp import kernel as dcp_kernels

    select = torch.ops.sparse_decode.select_candidate_blocks
    for rows, width in [(8, 128 << 10), (8, 256 << 10)] + ([] if quick else [(64, 256 << 10), (8, 512 << 10)]):
        sets = make_rows(rows, width)
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        times = []
        for wide in (False, True):
            with switched(short_row, "WIDE", wide):
                times.append(graph_us(lambda i: select(*sets[i % len(sets)], 8, K, out)))
        table.add("select_candidate_blocks bs=8", f"{rows}x{width >> 10}K", *times, f"{times[0] / times[1]:.2f}x",
                  9.0 if (rows, width) == (8, 128 << 10) else "")
    n = dcp.dcp_merge_local_topk(K, 2)
    for rows in (1, 8) if quick else (1, 8, 32):
        sets = make_rows(rows, 64 << 10, torch.bfloat16)
        packed = torch.empty(rows, dcp.packed_row_words(n), dtype=torch.int32, device="cuda")
        rescue = torch.empty(rows, dcp.packed_row_words(dcp.rescue_row_slots(K)), dtype=torch.int32, device="cuda")
        times = []
        for wide in (False, True):
            with switched(short_row, "WIDE", wide):
                times.append(graph_us(lambda i: dcp_kernels.dcp_pack(*sets[i % len(sets)], 2, 0, K, packed, rescue)))
        table.add("dcp_pack W=2", f"{rows}x64K bf16", *times, f"{times[0] / times[1]:.2f}x",
                  {1: 10.0, 32: 16.0}.get(rows, ""))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--tables", default="main,windows,fused", help="which tables to run, comma-separated")
    args = p.parse_args()
    tables = set(args.tables.split(","))
    dtype = getattr(torch, args.dtype)
    if "main" in tables:
        main_table(args, dtype)
    if "windows" in tables:
        windows = Table(f"row_starts: windows at random starts vs plain rows of the window's length, k={K}",
                        ["op", "windows", "windows (us)", "plain rows (us)", "ratio",
                         "plain rows of window + 1 (us)", "ratio to those"])
        # 16-byte-aligned starts beside random ones: a 128K window split over 8 CTAs fills two
        # tiles of 8K exactly when aligned, and one CTA takes a third when not.
        for rows, window, width, bs, align in [(8, 128 << 10, 256 << 10, 0, 1), (8, 128 << 10, 256 << 10, 0, 4),
                                               (64, 128 << 10, 256 << 10, 0, 1), (8, 128 << 10, 1 << 20, 8, 1),
                                               (8, 100_000, 256 << 10, 0, 1)][: 2 if args.quick else None]:
            bench_windows(windows, rows, window, width, bs, align)
        windows.emit(args.results)
    if "short" in tables:
        short = Table(f"indexer_topk on decode's everyday rows: the engine and the short-row path, k={K}",
                      ["shape", "rows", "engine (us)", "short path (us)", "speedup",
                       "read + k ids, no select (us)", "torch.topk (us)", "bar (us)", "meets bar"])
        for rows in (1, 8) if args.quick else (1, 8, 64, 256):
            for width in (8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10)[: 4 if rows > 64 else None]:
                for kind in ("randn", "ragged", "ties"):
                    bench_short(short, rows, width, kind, dtype)
        short.emit(args.results)
    if "wide" in tables:
        wide = Table(f"the short path's wide rows (clusters of 4 and 8 CTAs) beside the engine, k={K}",
                     ["op", "shape", "engine (us)", "wide rows (us)", "speedup", "bar (us)"])
        bench_wide_users(wide, args.quick)
        wide.emit(args.results)
    if "fused" in tables:
        fused = Table(f"indexer_topk_fused: KV slots + raw ids + values beside plain indexer_topk, k={K}",
                      ["op", "shape", "outputs", "fused (us)", "plain (us)", "difference (us)", "<= 0.5 us"])
        for rows, width in [(8, 128 << 10), (64, 128 << 10)][: 1 if args.quick else None]:
            bench_fused(fused, rows, width)
        fused.emit(args.results)


def main_table(args, dtype) -> None:
    measured, bandwidth = floor_bandwidth_tbs()
    table = Table(
        f"select_candidate_blocks / indexer_topk, k={K} (copy bandwidth: measured {measured:.2f} TB/s, "
        f"floor at {bandwidth:.2f} TB/s)",
        ["op", "shape", "ours (us)", "torch baseline (us)", "speedup", "one-read floor (us)", "bar (us)", "meets bar"],
    )
    block_shapes = [(8, 128 << 10, 64), (8, 128 << 10, 8)] if args.quick else [
        (rows, width, bs) for rows in (1, 8, 64) for width in (32 << 10, 128 << 10, 1 << 20) for bs in (64, 8)
    ]
    for rows, width, bs in block_shapes:
        bench_blocks(table, bandwidth, rows, width, bs, dtype)
    token_shapes = [(8, 128 << 10)] if args.quick else [(r, w) for r in (8, 64) for w in (128 << 10, 1 << 20)]
    for rows, width in token_shapes:
        bench_tokens(table, bandwidth, rows, width, dtype)
    table.emit(args.results)


if __name__ == "__main__":
    main()
