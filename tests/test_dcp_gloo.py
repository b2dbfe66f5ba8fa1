"""Multi-process DCP merge over a gloo group: every rank gets the oracle's ids, and the one-round
path (with rescue) and the generic path are bit-identical, on rows that saturate the most ranks."""

import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import torch_sparse_decode as tsd

import oracle
from dcp_cases import count_saturated, mixed, saturating
from multiproc import run_ranks
from torch_sparse_decode import dcp
from torch_sparse_decode.ops.dcp import group as dcp_group


def _cases(world_size: int):
    for topk in (64, 256, 2048):
        n = dcp.dcp_merge_local_topk(topk, world_size)
        if n:
            x, lengths = saturating(world_size, topk, max(topk, 2 * n) + 33, seed=topk)
            yield f"saturating K={topk}", topk, x, lengths, dcp.max_saturated_ranks(topk, n)
    for kind in ("random", "all_equal", "nan_mixed", "inf_mixed", "tiny_negative"):
        x, lengths = mixed(world_size, 1000, seed=world_size, kind=kind)
        yield kind, 256, x, lengths, None


def _body(rank: int, world_size: int, group) -> None:
    # Fail closed on a CPU group: every rank keeps the generic merge.
    assert dcp.init_dcp_topk_merge(group, 2048, max_rows=64) == 0
    assert dcp.init_dcp_topk_merge(group, 2048, max_rows=64) == 0  # idempotent
    # The agreement is a MIN over ranks: one rank without support turns it off for all.
    assert dcp_group._agree(group, True) is True
    assert dcp_group._agree(group, rank != world_size - 1) is False
    for name, topk, x, lengths, most in _cases(world_size):
        if most is not None:
            assert count_saturated(world_size, topk, x, lengths).max().item() == most, name
        want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, topk)
        n = dcp.dcp_merge_local_topk(topk, world_size)
        generic = dcp.dcp_topk_merge(x[rank], lengths[rank], topk, group)
        paths = {"generic": generic}
        if n:
            paths["one-round"] = dcp.dcp_topk_merge(x[rank], lengths[rank], topk, group, local_topk=n)
        for path, (global_ids, local_ids, local_count) in paths.items():
            where = f"{name} {path} rank {rank}"
            assert torch.equal(global_ids, want_global), where
            assert torch.equal(local_ids, want_local[rank]), where
            assert torch.equal(local_count, want_count[rank]), where
        # Every rank holds the same global ids.
        everyone = [torch.empty_like(generic[0]) for _ in range(world_size)]
        dist.all_gather(everyone, generic[0], group=group)
        assert all(torch.equal(e, generic[0]) for e in everyone), name


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_gloo_group(world_size):
    run_ranks(_body, world_size, "gloo")


def _fail_on_last(rank: int, world_size: int, group) -> None:
    assert rank != world_size - 1, "planted failure"


def test_a_failing_rank_fails_the_test():
    with pytest.raises(AssertionError, match=r"ranks \[1\] of 2"):
        run_ranks(_fail_on_last, 2, "gloo", timeout_s=120)


def _nothing_in_flight_after_a_refused_init(rank: int, world_size: int, group) -> None:
    """init_dcp_topk_merge raising (ranks disagree) leaves no collective of its own in flight: the
    next collectives of the group line up, rank for rank, with the values each rank sent."""
    for attempt in range(3):
        with pytest.raises(ValueError, match="topk must be the same on every rank"):
            dcp.init_dcp_topk_merge(group, 256 + rank, max_rows=8)
        mine = torch.tensor([rank + 10 * attempt], dtype=torch.int64)
        gathered = [torch.zeros_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine, group=group)
        assert [int(t) for t in gathered] == [r + 10 * attempt for r in range(world_size)]


def test_a_refused_init_leaves_no_collective_in_flight():
    run_ranks(_nothing_in_flight_after_a_refused_init, 2, "gloo", timeout_s=120)


def _divergent_arguments(rank: int, world_size: int, group) -> None:
    """Arguments that differ between ranks, or are bad on one rank, raise on every rank (no rank
    is left waiting in the agreement's all-reduce)."""
    with pytest.raises(ValueError, match="max_rows must be the same on every rank"):
        dcp.init_dcp_topk_merge(group, 2048, max_rows=8 + rank)
    with pytest.raises(ValueError, match="max_local_len must be the same on every rank"):
        dcp.init_dcp_topk_merge(group, 2048, max_rows=8, max_local_len=None if rank else 4096)
    want = r"max_rows must be in \[1, 65535\], got 0" if rank == 1 else "another rank of the group got invalid"
    with pytest.raises(ValueError, match=want):
        dcp.init_dcp_topk_merge(group, 2048, max_rows=0 if rank == 1 else 8)
    assert dcp.init_dcp_topk_merge(group, 2048, max_rows=8, max_local_len=4096) == 0  # then a good call agrees


def test_divergent_arguments_raise_on_every_rank():
    run_ranks(_divergent_arguments, 3, "gloo")


def _init_checks_arguments_first(rank: int, world_size: int, group) -> None:
    """Every argument is checked before the one collective, which also carries topk: a bad or
    mismatched argument, or a support probe that raises, ends in an error (or the generic merge)
    on every rank, never a peer left waiting. A repeated call with other arguments is refused."""
    want = "topk must be an int, got str" if rank == 1 else "another rank of the group got invalid arguments"
    with pytest.raises(TypeError if rank == 1 else ValueError, match=want):
        dcp.init_dcp_topk_merge(group, "128" if rank == 1 else 128, max_rows=8)
    with pytest.raises(ValueError, match="topk must be the same on every rank of the group, got 128 to 129"):
        dcp.init_dcp_topk_merge(group, 128 + (rank == 1), max_rows=8)
    probe = dcp_group._local_support
    if rank == 0:
        def broken(*args):
            raise RuntimeError("planted probe failure")
        dcp_group._local_support = broken
    try:
        assert dcp.init_dcp_topk_merge(group, 512, max_rows=8) == 0
    finally:
        dcp_group._local_support = probe
    assert dcp.init_dcp_topk_merge(group, 512, max_rows=8) == 0  # the same call again: the agreed value
    with pytest.raises(ValueError, match="already called for group .* topk=512"):
        dcp.init_dcp_topk_merge(group, 512, max_rows=16)


def test_init_checks_arguments_on_every_rank():
    run_ranks(_init_checks_arguments_first, 2, "gloo", timeout_s=120)


def _warmup_on_rank_zero(rank: int, world_size: int, group) -> None:
    if rank == 0:
        tsd.warmup("cpu")  # rank 1 does not call it: a collective inside would never complete


def test_warmup_leaves_process_groups_alone():
    run_ranks(_warmup_on_rank_zero, 2, "gloo", timeout_s=120)
    code = "import torch_sparse_decode as t, torch.distributed as d; t.warmup('cpu'); assert not d.is_initialized()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def _mismatched_steps(rank: int, world_size: int, group) -> None:
    """Ranks that disagree on the step's topk or row count raise the same ValueError on every
    rank, on both paths, before any exchange (K = 100 and 110 share N = 96 and the rescue width,
    so the exchange itself would have gone through, with 10 wrong ids)."""
    x, lengths = mixed(world_size, 600, seed=3)
    for local_topk in (None, 96):
        assert dcp.dcp_merge_local_topk(100, 2) == dcp.dcp_merge_local_topk(110, 2) == 96
        with pytest.raises(ValueError, match=r"disagree on the step \(rank 0: 4 rows, topk=100, rank 1: 4 rows, "
                                             r"topk=110\)"):
            dcp.dcp_topk_merge(x[rank], lengths[rank], 100 + 10 * rank, group, local_topk=local_topk)
        rows = 4 - rank
        with pytest.raises(ValueError, match=r"rank 0: 4 rows, topk=100, rank 1: 3 rows, topk=100"):
            dcp.dcp_topk_merge(x[rank, :rows], lengths[rank, :rows], 100, group, local_topk=local_topk)
    got = dcp.dcp_topk_merge(x[rank], lengths[rank], 100, group)  # then an agreed step is exact
    assert torch.equal(got[0], oracle.dcp_global_topk(x, lengths, 100)[0])


def test_mismatched_steps_raise_on_every_rank():
    run_ranks(_mismatched_steps, 2, "gloo", timeout_s=120)


def _late_rank(rank: int, world_size: int, group, path: str, late: str) -> None:
    """With a step bound of 1 s (set at init), a rank that stalls 4 s or never calls: the rank
    that waits raises DcpStepError within the bound; a stalled rank that calls later raises too
    (its peer left the step). A group of its own keeps the world group's teardown clean."""
    sub = dist.new_group(backend="gloo")
    assert dcp.init_dcp_topk_merge(sub, 256, max_rows=8, timeout_s=1.0) == 0
    kwargs = {"local_topk": dcp.dcp_merge_local_topk(256, world_size)} if path == "one-round" else {}
    x, lengths = mixed(world_size, 600, seed=3)
    dcp.local_topk_keys(x[rank], lengths[rank], world_size, rank, 256)  # an op's first call imports torch._dynamo
    if rank == 1:
        time.sleep(4)
        if late == "never calls":
            return
    start = time.monotonic()
    with pytest.raises(dcp.DcpStepError, match="did not complete within 1 s"):
        dcp.dcp_topk_merge(x[rank], lengths[rank], 256, sub, **kwargs)
    assert time.monotonic() - start < 3, (rank, time.monotonic() - start)


@pytest.mark.parametrize("late", ["stalls", "never calls"])
@pytest.mark.parametrize("path", ["generic", "one-round"])
def test_a_late_rank_raises_within_the_step_bound(path, late):
    run_ranks(_late_rank, 2, "gloo", path, late, timeout_s=120)
