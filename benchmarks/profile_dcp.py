"""Where a DCP one-round step's time goes, on 2 GPUs (W = 2, K = 2048, 64K local tokens), all in
CUDA graphs (the harness's method). Four calls timed beside each other, per T in {1, 8, 32}:

- select: the local top-K alone (the engine, ord16 keys);
- local part: select + pack into a local buffer (bench_dcp.py's "local part");
- no merge: select + pack + push into the peers, then the merge's bounded wait (every unit of
  the row's tagged rows) and step advance with the merge cut out (``_wait_only`` below);
- full step: the op (``dcp_topk_merge``).

Differences give the parts: pack = local part - select; exchange (push, the wait across GPUs,
one more launch) = no merge - local part; merge = full step - no merge.

With ``--merge`` (one GPU): the CuTe merge kernel's phases (a profiled build stamps thread 0's
clock at the end of each, ops/dcp/merge.py PHASES), simulated W ranks, median over rows and
calls, beside the time per call of the shipped build.

    python benchmarks/profile_dcp.py [--quick] [--merge] [--results FILE]
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from bench_dcp import simulated_rows
from harness import ALIGNED, ROTATED, SAME_INPUTS, Table, graph_us, rank_aligner, rotation, two_gpu_main
from torch_sparse_decode.ops.dcp.config import packed_row_words, rescue_row_slots
from torch_sparse_decode.ops.dcp.merge_triton import advance_step, error_bits, wait_row
from torch_sparse_decode.ops.dcp.pack import step_tag

K = 2048
LOCAL = 65536


@triton.jit
def _wait_only(state, gathered, rank_stride, row_stride, parity_gathered, timeout_ns, W: tl.constexpr,
               N: tl.constexpr):
    """The merge's wait for every rank's tagged row of the step and its step advance, no merge."""
    row = tl.program_id(0).to(tl.int64)
    seq = tl.load(state)
    want = step_tag(seq)
    sent = gathered + (seq & 1) * parity_gathered + row * row_stride
    error = tl.full((), 0, tl.int32)
    for r in range(W):
        error |= error_bits(wait_row(sent + r * rank_stride, N + N // 32, want, timeout_ns, state), r)
    if error != 0:
        tl.atomic_or(state + 2, error.to(tl.int64))
    advance_step(state)


def _rank_main(rank: int, world_size: int, store: str, quick: bool, results: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world_size)
    group = dist.group.WORLD
    from torch_sparse_decode import dcp
    from torch_sparse_decode.ops.dcp import kernel as kernels
    from torch_sparse_decode.ops.dcp import step

    assert dcp.init_dcp_topk_merge(group, K, max_rows=32, max_local_len=LOCAL), "no one-round merge"
    ws = dcp.dcp_group(group, K).workspace
    table = Table(f"DCP step parts, W = {world_size}, K = {K}, {LOCAL >> 10}K local tokens (us per step, rank 0)",
                  ["T", "select", "local part", "no merge", "full step", "pack", "exchange", "merge"],
                  f"{ROTATED}; {ALIGNED}")
    for rows in (1, 8) if quick else (1, 8, 32):
        def make(seed: int):
            gen = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
            return (torch.randn(rows, LOCAL, device="cuda", generator=gen),
                    torch.full((rows,), LOCAL, dtype=torch.int32, device="cuda"))

        sets = rotation(make, rows * LOCAL * 4)
        packed = torch.empty(rows, packed_row_words(ws.local_topk), dtype=torch.int32, device="cuda")
        rescue = torch.empty(rows, packed_row_words(rescue_row_slots(K)), dtype=torch.int32, device="cuda")

        def select(i: int) -> None:
            step.local_topk_ids(*sets[i % len(sets)], ws.ids[:rows])

        def local(i: int) -> None:
            kernels.dcp_pack(*sets[i % len(sets)], world_size, rank, K, packed, rescue)

        def no_merge(i: int) -> None:
            scores, lengths = sets[i % len(sets)]
            step.local_topk_ids(scores, lengths, ws.ids[:rows])
            step.push_rows(ws, ws.ids[:rows], scores)
            _wait_only[(rows,)](ws.state, ws.exchange, ws.max_rows * ws.packed_words, ws.packed_words,
                                ws.exchange_parity, ws.timeout_ns, W=world_size, N=ws.local_topk, num_warps=4)

        def full(i: int) -> None:
            dcp.dcp_topk_merge(*sets[i % len(sets)], K, group)

        align = rank_aligner(group)
        t_select, t_local, t_no_merge, t_full = (graph_us(f, align=align) for f in (select, local, no_merge, full))
        dcp.dcp_topk_merge_check(group)
        table.add(rows, t_select, t_local, t_no_merge, t_full, t_local - t_select, t_no_merge - t_local,
                  t_full - t_no_merge)
    if rank == 0:
        table.emit(results)
    dist.barrier()
    dist.destroy_process_group()


def merge_phases(results: str, quick: bool) -> None:
    from torch_sparse_decode.ops.dcp import merge as dcp_merge

    phases = dcp_merge.PHASES
    table = Table(f"CuTe DCP merge phases, simulated W ranks, K = {K}, T = 8 (cycles since the start at each "
                  "phase's end, median over rows and 20 calls; us per call of the unprofiled build)",
                  ["W", "us per call", *phases], SAME_INPUTS)
    rows = 8
    for world_size in (2,) if quick else (2, 16):
        gathered, rescue, peers = simulated_rows(world_size, rows)
        flat = gathered.view(-1)
        count = torch.empty(rows, dtype=torch.int32, device="cuda")

        def run(profile: bool, outs):
            merge = dcp_merge.compiled(world_size, K, False, profile)
            merge(flat, gathered.stride(0), gathered.stride(1), peers, 0, rescue.stride(1), outs[0], outs[1],
                  count, 0, peers, 0, 0, 0)

        plain = [torch.empty(rows, K, dtype=torch.int32, device="cuda") for _ in range(2)]
        us = graph_us(lambda i: run(False, plain))
        wide = [torch.empty(rows, K + len(phases), dtype=torch.int32, device="cuda") for _ in range(2)]
        marks = []
        for _ in range(20):
            run(True, wide)
            marks.append(wide[0][:, K:].clone())
        assert torch.equal(wide[0][:, :K], plain[0]), "the profiled build's ids differ"
        med = torch.cat(marks).float().median(dim=0).values.tolist()
        table.add(world_size, us, *(int(m) for m in med))
    table.emit(results)


def main() -> None:
    two_gpu_main(__doc__, _rank_main, "--merge", "the CuTe merge kernel's phases (one GPU)", merge_phases)


if __name__ == "__main__":
    main()
