"""DCP decode top-k merge on 2 GPUs (W = 2, K = 2048, 64K local tokens), all in CUDA graphs (the harness's method),
then the merge kernel alone on simulated W = 4, 8, 16 (one GPU, peers through the address table).

Per T in {1, 8, 32}, beside each other in one run:
- ours: the full step (key pre-pass, engine, pack + symmetric-memory push, wait + merge), one op;
- ours, local part: the same pack into a local buffer (no push); the difference to the full step
  is what the exchange and the merge cost (the bar: <= 8 us);
- stock torch: each rank's torch.topk 2048 (score, id) pairs, NCCL all-gather, torch.topk;
- our top-k: the same full-K exchange with this library's indexer_topk for both selections;
- NCCL all-gather of our packed rows alone (untagged: 4 bytes a word); bytes a rank pushes per
  row per peer in the step (8 bytes a word: each word travels with the step's tag).
Each column is the median of ROUNDS rounds, and the exchange + merge's lowest and highest round
are shown beside it.

    python benchmarks/bench_dcp.py [--quick] [--merge-only] [--results FILE]
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from harness import ALIGNED, ROTATED, SAME_INPUTS, Table, graph_us, rank_aligner, rotation, two_gpu_main

K = 2048
LOCAL = 65536
ROUNDS = 3  # the 2-GPU table's columns are medians over rounds: one round's spread is ~2 us at T >= 8


def make_sets(rows: int, rank: int):
    def make(seed: int):
        gen = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
        x = torch.randn(rows, LOCAL, device="cuda", generator=gen)
        return x, torch.full((rows,), LOCAL, dtype=torch.int32, device="cuda")

    return rotation(make, rows * LOCAL * 4)


def gather_pairs(values, ids, world_size, group):
    """Every rank's (score, global id) pairs of each row, [rows, W * K] each: two NCCL all-gathers."""
    rows = values.shape[0]
    all_values = torch.empty(world_size * rows, K, dtype=values.dtype, device=values.device)
    all_ids = torch.empty(world_size * rows, K, dtype=ids.dtype, device=ids.device)
    dist.all_gather_into_tensor(all_values, values, group=group)
    dist.all_gather_into_tensor(all_ids, ids, group=group)
    by_row = lambda t: t.view(world_size, rows, K).permute(1, 0, 2).reshape(rows, -1)  # noqa: E731
    return by_row(all_values), by_row(all_ids)


def stock_torch_step(x, world_size, rank, group):
    values, index = torch.topk(x, K, dim=1)
    all_values, all_ids = gather_pairs(values, index * world_size + rank, world_size, group)
    best = torch.topk(all_values, K, dim=1).indices
    return all_ids.gather(1, best)


def our_topk_step(x, lengths, world_size, rank, group, local_out, final_out):
    select = torch.ops.sparse_decode.indexer_topk
    select(x, lengths, K, local_out)
    values = x.gather(1, local_out.clamp(min=0).long())
    all_values, all_ids = gather_pairs(values, local_out * world_size + rank, world_size, group)
    counts = torch.full((x.shape[0],), world_size * K, dtype=torch.int32, device=x.device)
    select(all_values, counts, K, final_out)
    return all_ids.gather(1, final_out.long())


def _rank_main(rank: int, world_size: int, store: str, quick: bool, results: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world_size)
    group = dist.group.WORLD
    from torch_sparse_decode import dcp
    from torch_sparse_decode.ops.dcp import kernel as kernels

    n = dcp.init_dcp_topk_merge(group, K, max_rows=32, max_local_len=LOCAL)
    assert n, "the one-round merge did not initialize"
    words = dcp.packed_row_words(n)
    table = Table(
        f"DCP merge, W = {world_size}, K = {K}, {LOCAL >> 10}K local tokens (us per step, rank 0)",
        ["T", "ours: full step", "ours: local part", "exchange + merge", "exchange + merge, lowest - highest round",
         "stock torch", "our top-k exchange", "NCCL all-gather of packed rows", "bytes/row/rank pushed (tagged)",
         "stock / ours", "bars met: exchange + merge <= 8 us; >= 3x stock; < our top-k"],
        f"{ROTATED}; {ALIGNED}; each column the median of {ROUNDS} rounds (a round times every column once)",
    )
    for rows in (1, 8) if quick else (1, 8, 32):
        sets = make_sets(rows, rank)
        full = lambda i: dcp.dcp_topk_merge(*sets[i % len(sets)], K, group)  # noqa: E731
        packed = torch.empty(rows, words, dtype=torch.int32, device="cuda")
        rescue = torch.empty(rows, dcp.packed_row_words(dcp.rescue_row_slots(K)), dtype=torch.int32, device="cuda")
        local = lambda i: kernels.dcp_pack(*sets[i % len(sets)], world_size, rank, K, packed, rescue)  # noqa: E731
        stock = lambda i: stock_torch_step(sets[i % len(sets)][0], world_size, rank, group)  # noqa: E731
        local_out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        final_out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        ours_topk = lambda i: our_topk_step(*sets[i % len(sets)], world_size, rank, group,  # noqa: E731
                                            local_out, final_out)
        gathered = torch.empty(world_size * rows, words, dtype=torch.int32, device="cuda")
        gather = lambda i: dist.all_gather_into_tensor(gathered, packed, group=group)  # noqa: E731
        align = rank_aligner(group)
        rounds = [[graph_us(f, align=align) for f in (full, local, stock, ours_topk, gather)] for _ in range(ROUNDS)]
        dcp.dcp_topk_merge_check(group)
        t_full, t_local, t_stock, t_ours, t_gather = (statistics.median(column) for column in zip(*rounds))
        each = sorted(r[0] - r[1] for r in rounds)
        exchange = statistics.median(each)
        met = ("yes" if ok else "no" for ok in (exchange <= 8.0, t_stock / t_full >= 3.0, t_full < t_ours))
        table.add(rows, t_full, t_local, exchange, f"{each[0]:.2f} - {each[-1]:.2f}", t_stock, t_ours, t_gather,
                  words * 8, f"{t_stock / t_full:.2f}x", " / ".join(met))
    if rank == 0:
        table.emit(results)
        simulated(results, quick)
    dist.barrier()
    dist.destroy_process_group()


def simulated_rows(world_size: int, rows: int, device: str = "cuda"):
    """(gathered [W, T, words], rescue rows [W, T, words'], their address table): the B' rows of W
    simulated ranks' random scores, 2 x 64K tokens split over the ranks."""
    from torch_sparse_decode import dcp
    from torch_sparse_decode.ops.dcp import kernel as kernels

    local = LOCAL * 2 // world_size
    x = torch.randn(world_size, rows, local, device=device)
    lengths = torch.full((world_size, rows), local, dtype=torch.int32, device=device)
    packs = [dcp.pack_candidates(x[r], lengths[r], world_size, r, K) for r in range(world_size)]
    rescue = torch.stack([q for _, q in packs])
    return torch.stack([p for p, _ in packs]), rescue, kernels.stacked_peers(rescue)


def simulated(results: str, quick: bool) -> None:
    """The merge kernel alone, W ranks simulated on one GPU (rescue rows through the address table):
    the shipped CuTe merge beside the Triton one (the CPU interpreter's twin)."""
    from torch_sparse_decode import dcp
    from torch_sparse_decode.ops.dcp import kernel as kernels, launch

    shipped = launch.MERGE_KERNEL
    merges = ("cute", "triton")
    table = Table(f"DCP merge kernel alone, simulated W ranks, K = {K} (us per call; shipped: {shipped}; "
                  f"Triton at {launch.MERGE_WARPS} warps)",
                  ["W", "T", *(f"merge, {m}" for m in merges), "candidates per row"], SAME_INPUTS)
    for world_size in (2, 4, 8, 16):
        for rows in (1, 8) if quick else (1, 8, 32):
            gathered, rescue, peers = simulated_rows(world_size, rows)
            outs = [torch.empty(rows, K, dtype=torch.int32, device="cuda") for _ in range(2)]
            count = torch.empty(rows, dtype=torch.int32, device="cuda")
            times = []
            for merge in merges:
                def call(i, merge=merge):
                    kernels.merge_rows(gathered, peers, rescue.stride(1), K, 0, *outs, count, kernel=merge)

                times.append(graph_us(call))
            table.add(world_size, rows, *times, world_size * dcp.dcp_merge_local_topk(K, world_size))
    table.emit(results)


def main() -> None:
    two_gpu_main(__doc__, _rank_main, "--merge-only", "only the simulated merge kernel (one GPU)", simulated)


if __name__ == "__main__":
    main()
