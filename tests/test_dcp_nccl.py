"""The process-group DCP merge on two GPUs over NCCL (one process per GPU): init fails closed
(the one-round GPU merge is not built yet) and the generic merge gives the oracle's ids."""

import os
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import oracle
from dcp_cases import mixed, saturating
from torch_sparse_decode import dcp

pytestmark = pytest.mark.multigpu


def _worker(rank: int, world_size: int, store_path: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        group = dist.group.WORLD
        assert dcp.init_dcp_topk_merge(group, 2048, max_rows=32, max_local_len=1 << 16) == 0
        cases = [saturating(world_size, 2048, 4096, seed=1), mixed(world_size, 65536, seed=2, kind="relu_zeros"),
                 mixed(world_size, 3000, seed=3, kind="all_equal")]
        for x, lengths in cases:
            want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, 2048)
            got = dcp.dcp_topk_merge(x[rank].cuda(), lengths[rank].cuda(), 2048, group)
            assert torch.equal(got[0].cpu(), want_global)
            assert torch.equal(got[1].cpu(), want_local[rank])
            assert torch.equal(got[2].cpu(), want_count[rank])
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        raise
    dist.destroy_process_group()


def test_nccl_generic_merge_two_gpus():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)
