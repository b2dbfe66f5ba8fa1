"""The process-group DCP merge on two GPUs over NCCL (one process per GPU): init fails closed
(the one-round GPU merge is not built yet) and the generic merge gives the oracle's ids."""

import pytest
import torch

import oracle
from dcp_cases import mixed, saturating
from multiproc import run_ranks
from torch_sparse_decode import dcp

pytestmark = pytest.mark.multigpu


def _body(rank: int, world_size: int, group) -> None:
    assert dcp.init_dcp_topk_merge(group, 2048, max_rows=32, max_local_len=1 << 16) == 0
    cases = [saturating(world_size, 2048, 4096, seed=1), mixed(world_size, 65536, seed=2, kind="relu_zeros"),
             mixed(world_size, 3000, seed=3, kind="all_equal")]
    for x, lengths in cases:
        want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, 2048)
        got = dcp.dcp_topk_merge(x[rank].cuda(), lengths[rank].cuda(), 2048, group)
        assert torch.equal(got[0].cpu(), want_global)
        assert torch.equal(got[1].cpu(), want_local[rank])
        assert torch.equal(got[2].cpu(), want_count[rank])


def test_nccl_generic_merge_two_gpus():
    run_ranks(_body, 2, "nccl")
