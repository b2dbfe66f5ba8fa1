"""Multi-process DCP merge over a gloo group: every rank gets the oracle's ids, and the one-round
path (with rescue) and the generic path are bit-identical, on rows that saturate the most ranks."""

import os
import traceback
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import oracle
from dcp_cases import count_saturated, mixed, saturating
from torch_sparse_decode import dcp


def _cases(world_size: int):
    for topk in (64, 256, 2048):
        n = dcp.dcp_merge_local_topk(topk, world_size)
        if n:
            x, lengths = saturating(world_size, topk, max(topk, 2 * n) + 33, seed=topk)
            yield f"saturating K={topk}", topk, x, lengths, dcp.rescue_slots(topk, n)
    for kind in ("random", "all_equal", "nan_mixed", "inf_mixed", "tiny_negative"):
        x, lengths = mixed(world_size, 1000, seed=world_size, kind=kind)
        yield kind, 256, x, lengths, None


def _worker(rank: int, world_size: int, store_path: str) -> None:
    torch.set_num_threads(1)
    # Loopback only: gloo otherwise picks the interface of the host name, which a sandbox may not route.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        group = dist.group.WORLD
        # Fail closed on a CPU group: every rank keeps the generic merge.
        assert dcp.init_dcp_topk_merge(group, 2048, max_rows=64) == 0
        assert dcp.init_dcp_topk_merge(group, 2048, max_rows=64) == 0  # idempotent
        # The agreement is a MIN over ranks: one rank without support turns it off for all.
        assert dcp._agree(True, group) is True
        assert dcp._agree(rank != world_size - 1, group) is False
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
            dist.all_gather(everyone, generic[0])
            assert all(torch.equal(e, generic[0]) for e in everyone), name
        dist.barrier()
    except BaseException:
        # A peer may still be inside a collective: tearing the group down now would abort this
        # process and hide the error, so report it and leave the group to the exit.
        traceback.print_exc()
        raise
    dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_gloo_group(world_size):
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.spawn(_worker, args=(world_size, store), nprocs=world_size, join=True)
