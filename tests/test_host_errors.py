"""Bad arguments get a clear TypeError / ValueError naming the argument, before anything is
allocated or launched, the same on every device; outputs that alias each other or an input are
refused; integer arguments of any integral type are taken."""

import numpy as np
import pytest
import torch

import torch_sparse_decode as tsd
from inputs import DEVICES
from torch_sparse_decode import dcp
from torch_sparse_decode.ops.dcp import group as dcp_group


def _raises(kind, match, fn):
    with pytest.raises(kind, match=match):
        fn()


@pytest.mark.parametrize("device", DEVICES)
def test_dcp_wrappers_check_before_allocating(device):
    x = torch.randn(3, 100, device=device)
    n = torch.full((3,), 100, dtype=torch.int32, device=device)
    _raises(TypeError, "topk must be an int, got str", lambda: dcp.pack_candidates(x, n, 2, 0, "128"))
    _raises(ValueError, r"topk must be in \[1, 4096\], got -1", lambda: dcp.local_topk_keys(x, n, 2, 0, -1))
    _raises(ValueError, r"rank must be in \[0, 1\], got 2", lambda: dcp.pack_candidates(x, n, 2, 2, 256))
    _raises(ValueError, r"world_size must be in \[1, 16\], got 17", lambda: dcp.local_topk_keys(x, n, 17, 0, 256))
    _raises(ValueError, "gathered_keys must be a 3-D tensor, got \\(3, 4\\)",
            lambda: dcp.merge_generic(torch.zeros(3, 4, dtype=torch.int64, device=device), 0))
    packed, rescue = dcp.pack_candidates(x, n, 2, 0, 256)
    _raises(ValueError, r"topk must be in \[1, 4096\], got -1",
            lambda: dcp.merge_packed(torch.stack([packed] * 2), torch.stack([rescue] * 2), -1, 0))
    _raises(ValueError, "gathered must be a 3-D tensor", lambda: dcp.merge_packed(packed, rescue, 256, 0))
    _raises(ValueError, r"topk must be in \[1, 4096\], got 0", lambda: dcp.simulate_dcp_topk(x[None], n[None], 0))
    _raises(ValueError, r"topk must be in \[1, 4096\], got -1", lambda: dcp.dcp_topk_merge(x, n, -1, None))


@pytest.mark.parametrize("device", DEVICES)
def test_dcp_zero_rows_and_zero_width(device):
    """Empty batches and rows with no local tokens: empty outputs and -1 padding, on every device."""
    world, topk = 2, 256
    ids = dcp.simulate_dcp_topk(torch.randn(world, 0, 100, device=device),
                                torch.zeros(world, 0, dtype=torch.int32, device=device), topk)
    assert ids.shape == (0, topk)
    packed, rescue = dcp.pack_candidates(torch.randn(0, 100, device=device),
                                         torch.zeros(0, dtype=torch.int32, device=device), world, 0, topk)
    global_ids, local_ids, count = dcp.merge_packed(torch.stack([packed] * 2), torch.stack([rescue] * 2), topk, 0)
    assert global_ids.shape == (0, topk) and count.shape == (0,)
    lengths = torch.full((world, 3), 5, dtype=torch.int32, device=device)
    ids = dcp.simulate_dcp_topk(torch.randn(world, 3, 0, device=device), lengths, topk)
    assert (ids == -1).all() and ids.shape == (3, topk)
    keys = dcp.local_topk_keys(torch.randn(3, 0, device=device), lengths[0], world, 0, topk)
    assert (keys == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_topk_wrappers_name_k_as_given(device):
    x = torch.randn(3, 50, device=device)
    n = torch.full((3,), 50, dtype=torch.int32, device=device)
    _raises(ValueError, r"k must be in \[1, 4096\], got -1", lambda: tsd.indexer_topk(x, n, -1))
    _raises(ValueError, r"k must be in \[1, 4096\], got 0", lambda: tsd.select_candidate_blocks(x, n, 4, 0))
    _raises(ValueError, r"block_size must be in \[1, 256\], got 0", lambda: tsd.select_candidate_blocks(x, n, 0, 4))
    _raises(TypeError, "k must be an int, got float", lambda: tsd.indexer_topk(x, n, 2.0))
    _raises(TypeError, "k must be an int, got bool", lambda: tsd.indexer_topk(x, n, True))


@pytest.mark.parametrize("device", DEVICES)
def test_numpy_integers_are_ints(device):
    x = torch.randn(3, 50, device=device)
    n = torch.full((3,), 50, dtype=torch.int32, device=device)
    assert torch.equal(tsd.indexer_topk(x, n, np.int64(5)), tsd.indexer_topk(x, n, 5))
    assert torch.equal(tsd.select_candidate_blocks(x, n, np.int32(4), np.int64(3)),
                       tsd.select_candidate_blocks(x, n, 4, 3))
    s = torch.rand(2, 8, device=device)
    assert torch.equal(tsd.moe_route(s, torch.zeros(8, device=device), np.int64(2))[1],
                       tsd.moe_route(s, torch.zeros(8, device=device), 2)[1])
    assert torch.equal(dcp.local_topk_keys(x, n, np.int64(2), np.int64(1), np.int16(64)),
                       dcp.local_topk_keys(x, n, 2, 1, 64))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_route_checks_topk_and_out(device):
    s, b = torch.rand(2, 8, device=device), torch.zeros(8, device=device)
    _raises(ValueError, r"topk must be in \[1, 32\], got -1", lambda: tsd.moe_route(s, b, -1))
    _raises(TypeError, "out must be a \\(weights, ids\\) pair of tensors, got tuple of 1",
            lambda: tsd.moe_route(s, b, 2, out=(torch.empty(2, 2, device=device),)))


@pytest.mark.parametrize("device", DEVICES)
def test_aliased_outputs_are_refused(device):
    s, b = torch.rand(2, 8, device=device), torch.zeros(8, device=device)
    w = torch.empty(2, 2, device=device)
    _raises(ValueError, "weights must not overlap ids", lambda: tsd.moe_route(s, b, 2, out=(w, w.view(torch.int32))))
    _raises(ValueError, "weights must not overlap scores",
            lambda: tsd.moe_route(s, b, 8, out=(s, torch.empty(2, 8, dtype=torch.int32, device=device))))
    both = torch.empty(3, 4, dtype=torch.int32, device=device)
    keys = torch.full((2, 3, 4), -1, dtype=torch.int64, device=device)
    _raises(ValueError, "global_ids must not overlap local_ids", lambda: torch.ops.sparse_decode.dcp_merge_generic(
        keys, 0, both, both, torch.empty(3, dtype=torch.int32, device=device)))
    lengths = torch.full((3,), 50, dtype=torch.int32, device=device)
    _raises(ValueError, "out must not overlap lengths",
            lambda: tsd.indexer_topk(torch.rand(3, 50, device=device), lengths, 1, out=lengths.view(3, 1)))
    # Disjoint parts of one buffer are fine.
    buffer = torch.empty(2 * 2 * 2, device=device)
    tsd.moe_route(s, b, 2, out=(buffer[:4].view(2, 2), buffer[4:].view(torch.int32).view(2, 2)))


@pytest.mark.parametrize("device", DEVICES)
def test_row_limit_is_the_same_everywhere(device):
    rows = 65536
    x = torch.randn(rows, 4, device=device)
    n = torch.full((rows,), 4, dtype=torch.int32, device=device)
    for fn in (lambda: dcp.pack_candidates(x, n, 2, 0, 256), lambda: dcp.local_topk_keys(x, n, 2, 0, 256),
               lambda: tsd.indexer_topk(x, n, 2)):
        _raises(ValueError, "scores may have at most 65535 rows, got 65536", fn)


def test_workspace_offsets_stay_32_bit():
    """K = 4096 on 2 ranks: 50,841 rows would put rescue offsets past 2**31."""
    error = dcp_group._argument_error(4096, 50841, None, 30.0, 2)
    assert isinstance(error, ValueError) and "max_rows must be at most 50840 for topk=4096 on 2 ranks" in str(error)
    assert dcp_group._argument_error(4096, 50840, None, 30.0, 2) is None
    assert isinstance(dcp_group._argument_error("128", 8, None, 30.0, 2), TypeError)
