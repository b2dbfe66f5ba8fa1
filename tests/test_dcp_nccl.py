"""The process-group DCP merge on two GPUs (one process per GPU, NCCL + symmetric memory).

- generic: init fails closed for local lengths beyond 2**17, and the generic merge (one NCCL
  all-gather of every rank's local top-K) gives the oracle's ids;
- one-round: init agrees on N, and the full step (pack + symmetric-memory
  push + merge) gives the oracle's ids on both ranks: eager at T in {1, 8, 32}, replayed from a
  CUDA graph over many steps with changing inputs (the device-side step counter walks the
  parities), under torch.compile(fullgraph=True), with steps too large for the workspace taking
  the generic merge, and with the NCCL transport (``local_topk=N``: packed and rescue rows
  all-gathered) on the same kernels; init fails closed when one rank lacks support; a peer that
  never arrives gives a bounded wait, no ids and an error, not a hang;
- ranks that disagree on the step's rows or topk, or come late, raise within the step bound.
"""

import pytest
import torch
import torch.distributed as dist

import oracle
from dcp_cases import mixed, saturating
from multiproc import run_ranks
from torch_sparse_decode import dcp
from torch_sparse_decode.ops.dcp import group as dcp_group

pytestmark = pytest.mark.multigpu

K = 2048


def _expect(got, x, lengths, rank, where):
    want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, K)
    assert torch.equal(got[0].cpu(), want_global), where
    assert torch.equal(got[1].cpu(), want_local[rank]), where
    assert torch.equal(got[2].cpu(), want_count[rank]), where


def _cases(world_size: int, rows: int):
    """Inputs every rank builds alike (same seeds): saturating rows, ties, NaN/inf, short rows."""
    yield "saturating", saturating(world_size, K, 4096, seed=rows)
    for i, kind in enumerate(("random", "relu_zeros", "all_equal", "inf_mixed", "bf16_plateau")):
        x, lengths = mixed(world_size, 65536, seed=rows + i, kind=kind)
        yield kind, (x.repeat(1, -(-rows // 4), 1)[:, :rows], lengths.repeat(1, -(-rows // 4))[:, :rows])


def _generic_body(rank: int, world_size: int, group) -> None:
    assert dcp.init_dcp_topk_merge(group, K, max_rows=32, max_local_len=(1 << 17) + 1) == 0
    for name, (x, lengths) in _cases(world_size, 4):
        got = dcp.dcp_topk_merge(x[rank].cuda(), lengths[rank].cuda(), K, group)
        _expect(got, x, lengths, rank, name)


def test_nccl_generic_merge_two_gpus():
    run_ranks(_generic_body, 2, "nccl")


def _one_round_body(rank: int, world_size: int, group) -> None:
    n = dcp.init_dcp_topk_merge(group, K, max_rows=32, max_local_len=1 << 16, timeout_s=20.0)
    assert n == dcp.dcp_merge_local_topk(K, world_size) == 1536
    step = lambda x, lengths: dcp.dcp_topk_merge(x, lengths, K, group)  # noqa: E731

    # Eager, every kind, T in {1, 8, 32}; the NCCL transport on the same inputs. The workspace's
    # step sequence counts the steps that took the one-round path.
    sequence = dcp.dcp_group(group, K).workspace.state
    before, steps = sequence[0].item(), 0
    for rows in (1, 8, 32):
        for name, (x, lengths) in _cases(world_size, rows):
            mine = x[rank].cuda(), lengths[rank].cuda()
            _expect(step(*mine), x, lengths, rank, f"{name} T={rows}")
            _expect(dcp.dcp_topk_merge(*mine, K, group, local_topk=n), x, lengths, rank, f"{name} nccl T={rows}")
            steps += 1
    dcp.dcp_topk_merge_check(group)
    assert sequence[0].item() - before == steps, "an eager step did not take the one-round path"

    # Rows beyond the workspace, and rows wider than max_local_len, take the generic merge (the
    # same decision on every rank).
    x, lengths = mixed(world_size, 3000, seed=5, kind="random")
    x, lengths = x.repeat(1, 9, 1), lengths.repeat(1, 9)  # 36 rows > max_rows
    _expect(step(x[rank].cuda(), lengths[rank].cuda()), x, lengths, rank, "beyond max_rows")
    x, lengths = mixed(world_size, (1 << 16) + 1, seed=6, kind="random")
    _expect(step(x[rank].cuda(), lengths[rank].cuda()), x, lengths, rank, "beyond max_local_len")
    assert sequence[0].item() - before == steps, "a step that does not fit took the one-round path"

    # One captured step replayed over changing inputs.
    static_x = torch.zeros(8, 65536, device="cuda")
    static_lengths = torch.zeros(8, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(static_x, static_lengths)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static_x, static_lengths)
    for i in range(24):
        kind = ("random", "relu_zeros", "all_equal", "bf16_plateau")[i % 4]
        x, lengths = mixed(world_size, 65536, seed=100 + i, kind=kind)
        x, lengths = x.repeat(1, 2, 1), lengths.repeat(1, 2)
        static_x.copy_(x[rank])
        static_lengths.copy_(lengths[rank])
        graph.replay()
        _expect(captured, x, lengths, rank, f"replay {i} {kind}")
    dcp.dcp_topk_merge_check(group)

    # torch.compile(fullgraph=True): the step is one op with the group's name.
    compiled = torch.compile(step, fullgraph=True)
    for name, (x, lengths) in _cases(world_size, 8):
        _expect(compiled(x[rank].cuda(), lengths[rank].cuda()), x, lengths, rank, f"compiled {name}")

    # Fail closed: one rank without support turns the one-round merge off for both.
    real = dcp_group._local_support
    if rank == 1:
        dcp_group._local_support = lambda *a: (False, "planted")
    assert dcp.init_dcp_topk_merge(group, 1024, max_rows=8) == 0
    dcp_group._local_support = real

    # A peer that never comes: bounded wait, no ids, and (eager) the step raises, naming rank 1.
    assert dcp.init_dcp_topk_merge(group, 512, max_rows=4, timeout_s=2.0) > 0
    dist.barrier(group=group)
    if rank == 0:
        x = torch.rand(2, 1000, device="cuda")
        with pytest.raises(dcp.DcpStepError, match=r"rank\(s\) 1 did not send their rows within 2 s"):
            dcp.dcp_topk_merge(x, torch.full((2,), 1000, dtype=torch.int32, device="cuda"), 512, group)
        dcp.dcp_topk_merge_check(group, 512)  # reported once
    dist.barrier(group=group)


def test_one_round_two_gpus():
    run_ranks(_one_round_body, 2, "nccl", timeout_s=480)


def _disagreeing_ranks_body(rank: int, world_size: int, group) -> None:
    """Ranks that disagree on a step, or come late, raise within the step bound (1 s) on the
    one-round path; on the generic path a mismatch raises on both ranks before any exchange."""
    import time

    for topk in (512, 640):
        assert dcp.init_dcp_topk_merge(group, topk, max_rows=4, timeout_s=1.0) > 0
    x, lengths = mixed(world_size, 3000, seed=1, kind="random")
    mine = x[rank].cuda(), lengths[rank].cuda()

    def raises(match, *args, bound=3.0, **kwargs):
        start = time.monotonic()
        with pytest.raises(dcp.DcpStepError, match=match):
            dcp.dcp_topk_merge(*args, **kwargs)
        assert time.monotonic() - start < bound, f"rank {rank}: {time.monotonic() - start:.1f} s"

    # Another row count: seen at once by the rank with fewer rows, within the bound by the other.
    rows = 4 - rank
    raises(r"another row count", mine[0][:rows], mine[1][:rows], 512, group)
    dist.barrier(group=group)
    # Then an agreed step is exact on both.
    _expect_k = oracle.dcp_global_topk(x, lengths, 512)[0]
    assert torch.equal(dcp.dcp_topk_merge(*mine, 512, group)[0].cpu(), _expect_k)
    # A rank that stalls 3 s: rank 0 raises within the bound; rank 1, late, gets the exact answer.
    if rank == 1:
        time.sleep(3)
        assert torch.equal(dcp.dcp_topk_merge(*mine, 512, group)[0].cpu(), _expect_k)
    else:
        raises(r"rank\(s\) 1 did not send", *mine, 512, group)
    dist.barrier(group=group)
    # Generic path (topk 300 was never set up): a mismatch raises the same error on both ranks.
    with pytest.raises(ValueError, match=r"disagree on the step \(rank 0: 4 rows, topk=300, rank 1: 4 rows, "
                                         r"topk=301\)"):
        dcp.dcp_topk_merge(*mine, 300 + rank, group)
    # Another topk (each has a workspace): neither rank's rows reach the other. (Last: the two
    # workspaces' steps no longer line up after it.)
    raises(r"did not send their rows within 1 s", *mine, 512 + 128 * rank, group)


def test_disagreeing_and_late_ranks_two_gpus():
    run_ranks(_disagreeing_ranks_body, 2, "nccl", timeout_s=300)
