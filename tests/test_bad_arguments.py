"""Bad arguments, one table per op: each row is a call (the raw op with one argument spoilt, or
the op's Python wrapper) and the exception it must raise, whose message names the argument,
before anything is allocated or launched, the same on every device. Integer arguments of any
integral type are taken. (Tensors on another device and the overlap rule: test_bad_input.py;
ranks of a group that disagree: test_dcp_gloo.py.)"""

import numpy as np
import pytest
import torch

import torch_sparse_decode as tsd
from dcp_cases import one_rank_group
from inputs import DEVICES
from test_registration import op_cases
from torch_sparse_decode import dcp

I32 = torch.int32


def raw(name, mutate):
    """The raw op on ``op_cases``' arguments, one of them spoilt by ``mutate``."""
    return lambda d: getattr(torch.ops.sparse_decode, name)(*mutate(op_cases(d)[name]))


def at(i, value):
    """A ``mutate`` that replaces argument i by ``value`` (or by ``value(argument)``)."""
    def mutate(args):
        args = list(args)
        args[i] = value(args[i]) if callable(value) else value
        return tuple(args)

    return mutate


def rand(d, *shape):
    return torch.rand(*shape, device=d)


def full(d, n, value):
    return torch.full((n,), value, dtype=I32, device=d)


def empty(d, *shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device=d)


def route(d, topk, **kw):
    return tsd.moe_route(rand(d, 2, 64), torch.zeros(64, device=d), topk, **kw)


def gate_route(d, spoil=lambda h, g, b: (h, g, b), topk=4, **kw):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 128, generator=gen).bfloat16().to(d)
    gate = (torch.randn(64, 128, generator=gen) * 0.1).bfloat16().to(d)
    return tsd.moe_gate_route(*spoil(hidden, gate, torch.zeros(64, device=d)), topk, **kw)


def _overlapping_front_outputs(d):
    shared = empty(d, 4 * 64 + 16)
    return shared[:16].view(4, 4), empty(d, 4, 4, dtype=I32), shared[8:8 + 256].view(4, 64)


def fused(d, out=None, ids=None, values=None, table=None, page_size=0):
    x, n = torch.randn(2, 100, device=d), torch.tensor([100, 5], dtype=I32, device=d)
    out = empty(d, 2, 8, dtype=I32) if out is None else out
    return torch.ops.sparse_decode.indexer_topk_fused(x, n, 8, out, ids, values, table, page_size)


def _fused_aliased(d):
    out = empty(d, 2, 8, dtype=I32)
    return fused(d, out, out, table=torch.zeros(2, 7, dtype=I32, device=d), page_size=16)


def blocks_fused(d, table):
    return tsd.select_candidate_blocks_fused(torch.randn(2, 100, device=d), torch.tensor([100, 5], dtype=I32, device=d),
                                             8, 4, table.to(d))


def _rows_over_buffer(d):
    buffer = torch.zeros(6, dtype=I32, device=d)
    return tsd.decode_row_lengths(buffer[:2], 2, out=buffer[1:5])


def scores3(d, rows=3, width=100):
    return torch.randn(rows, width, device=d), full(d, rows, width)


def _packed(d):
    x, n = scores3(d)
    return dcp.pack_candidates(x, n, 2, 0, 256)


def _aliased_merge(d):
    both = empty(d, 3, 4, dtype=I32)
    keys = torch.full((2, 3, 4), -1, dtype=torch.int64, device=d)
    return torch.ops.sparse_decode.dcp_merge_generic(keys, 0, both, both, empty(d, 3, dtype=I32))


def init(*args, **kw):
    return lambda d: dcp.init_dcp_topk_merge(one_rank_group(), *args, **kw)


TABLES = {
    "moe_route": [
        (TypeError, "scores must have dtype float32", raw("moe_route", at(0, lambda t: t.double()))),
        (ValueError, "scores must be 2-D|scores must be contiguous|weights must",
         raw("moe_route", at(0, lambda t: t.t()))),
        (ValueError, "scores must be contiguous",
         raw("moe_route", at(0, lambda t: torch.rand(5, 64, 2, device=t.device)[..., 0]))),
        (ValueError, "scores must have 1 to 1024 experts",
         raw("moe_route", at(0, lambda t: torch.rand(2, 2000, device=t.device)))),
        (ValueError, "bias must have shape", raw("moe_route", at(1, lambda t: t[:10]))),
        (TypeError, "bias must have dtype", raw("moe_route", at(1, lambda t: t.half()))),
        (ValueError, "topk must be in", raw("moe_route", at(2, 0))),
        (ValueError, "topk must be in", raw("moe_route", at(2, 33))),
        (ValueError, r"topk must be in \[1, 32\], got -1", lambda d: route(d, -1)),
        (TypeError, "topk must be an int", lambda d: route(d, 2.0)),
        (ValueError, "topk must be in", lambda d: tsd.moe_route(rand(d, 2, 8), torch.zeros(8, device=d), 9)),
        (TypeError, "renormalize must be a bool", lambda d: route(d, 2, renormalize=1)),
        (TypeError, "scale must be a float", lambda d: route(d, 2, scale="x")),
        (ValueError, "scale must be finite", raw("moe_route", at(4, float("nan")))),
        (ValueError, "scale must be finite", raw("moe_route", at(4, float("inf")))),
        (ValueError, r"num_expert_group \(3\) must divide the 64 experts", raw("moe_route", at(6, 3))),
        (ValueError, "num_expert_group must be in", raw("moe_route", at(6, 0))),
        (ValueError, r"num_expert_group must be in \[1, 32\]", raw("moe_route", at(6, 64))),
        (TypeError, "num_expert_group must be an int", lambda d: route(d, 4, num_expert_group=8.0, topk_group=2)),
        (ValueError, r"topk_group must be in \[1, 8\]", raw("moe_route", at(7, 9))),
        (ValueError, "topk must be <= topk_group . experts / num_expert_group = 16",
         lambda d: route(d, 17, num_expert_group=8, topk_group=2)),
        (ValueError, "weights must", raw("moe_route", at(8, lambda t: t[:, :3]))),
        (TypeError, "weights must have dtype float32", raw("moe_route", at(8, lambda t: t.half()))),
        (TypeError, "weights must have dtype float32",
         lambda d: route(d, 4, out=(empty(d, 2, 4, dtype=torch.bfloat16), empty(d, 2, 4, dtype=I32)))),
        (TypeError, "ids must have dtype int32", raw("moe_route", at(9, lambda t: t.long()))),
        (TypeError, r"out must be a \(weights, ids\) pair of tensors, got tuple of 1",
         lambda d: route(d, 2, out=(empty(d, 2, 2),))),
        (ValueError, "weights must not overlap ids",
         lambda d: (lambda w: route(d, 2, out=(w, w.view(I32))))(empty(d, 2, 2))),
        (ValueError, "weights must not overlap scores",
         lambda d: (lambda s: tsd.moe_route(s, torch.zeros(8, device=d), 8, out=(s, empty(d, 2, 8, dtype=I32))))(
             rand(d, 2, 8))),
    ],
    "moe_gate_route": [
        (TypeError, "hidden must have dtype bfloat16", lambda d: gate_route(d, lambda h, g, b: (h.float(), g, b))),
        (TypeError, "gate_weight must have dtype bfloat16", lambda d: gate_route(d, lambda h, g, b: (h, g.half(), b))),
        (ValueError, "gate_weight must have hidden's 128 columns",
         lambda d: gate_route(d, lambda h, g, b: (h, g[:, :64].contiguous(), b))),
        (ValueError, "gate_weight must have 1 to 1024 experts",
         lambda d: gate_route(d, lambda h, g, b: (h, g.repeat(17, 1), b))),
        (ValueError, "bias must have shape", lambda d: gate_route(d, lambda h, g, b: (h, g, b[:5]))),
        (ValueError, "topk must be in", lambda d: gate_route(d, topk=33)),
        (ValueError, r"router_logits must have shape",
         lambda d: gate_route(d, out=(empty(d, 4, 4), empty(d, 4, 4, dtype=I32), empty(d, 4, 63)))),
        (TypeError, r"out must be a \(weights, ids, router_logits\) triple", lambda d: gate_route(d, out=(1, 2))),
        (ValueError, "weights must not overlap router_logits",
         lambda d: gate_route(d, out=_overlapping_front_outputs(d))),
    ],
    "select_candidate_blocks": [
        (TypeError, "logits must have dtype float32 or bfloat16 or float16",
         raw("select_candidate_blocks", at(0, lambda t: t.double()))),
        (ValueError, "logits must have unit stride", raw("select_candidate_blocks", at(0, lambda t: t[:, ::2]))),
        (TypeError, "lengths must have dtype int32", raw("select_candidate_blocks", at(1, lambda t: t.long()))),
        (ValueError, "lengths must have shape", raw("select_candidate_blocks", at(1, lambda t: t[:2]))),
        (ValueError, "row_starts must have shape", raw("select_candidate_blocks", lambda a: (*a, a[1][:2]))),
        (ValueError, "block_size must be in", raw("select_candidate_blocks", at(2, 0))),
        (ValueError, "block_size must be in", raw("select_candidate_blocks", at(2, 257))),
        (ValueError, r"block_size must be in \[1, 256\], got 0",
         lambda d: tsd.select_candidate_blocks(*scores3(d, 3, 50), 0, 4)),
        (TypeError, "block_size must be an int", lambda d: tsd.select_candidate_blocks(*scores3(d, 2, 8), True, 4)),
        (ValueError, "k must be in", raw("select_candidate_blocks", at(3, 4097))),
        (ValueError, r"k must be in \[1, 4096\], got 0",
         lambda d: tsd.select_candidate_blocks(*scores3(d, 3, 50), 4, 0)),
        (ValueError, "out must have 3 rows", raw("select_candidate_blocks", at(4, lambda t: t[:2]))),
        (ValueError, "out must have k = 9 columns", raw("select_candidate_blocks", at(3, 9))),
        (ValueError, "out must have k = 4 columns",
         lambda d: tsd.select_candidate_blocks(*scores3(d, 2, 8), 2, 4, out=empty(d, 2, 5, dtype=I32))),
    ],
    "select_candidate_blocks_fused": [
        (ValueError, "block_table must have 2 rows of at least 13 blocks",
         lambda d: blocks_fused(d, torch.zeros(2, 12, dtype=I32))),
        (TypeError, "block_table must have dtype int32",
         lambda d: blocks_fused(d, torch.zeros(2, 16, dtype=torch.int64))),
    ],
    "indexer_topk": [
        (TypeError, "scores must be a torch.Tensor", lambda d: tsd.indexer_topk([1.0, 2.0], full(d, 1, 0), 4)),
        (TypeError, "scores must have dtype float32 or bfloat16 or float16",
         raw("indexer_topk", at(0, lambda t: t.double()))),
        (ValueError, "scores may have at most", raw("indexer_topk", at(0, lambda t: torch.empty(3, (1 << 20) + 1)))),
        (ValueError, "scores may have at most 65535 rows", raw("indexer_topk", lambda a: (
            torch.empty(65536, 4), torch.zeros(65536, dtype=I32), 16, torch.empty(65536, 16, dtype=I32)))),
        (ValueError, "scores may have at most 65535 rows, got 65536",
         lambda d: tsd.indexer_topk(*scores3(d, 65536, 4), 2)),
        (ValueError, "lengths must be 1-D", raw("indexer_topk", at(1, lambda t: t.reshape(3, 1)))),
        (TypeError, "row_starts must have dtype int32", raw("indexer_topk", lambda a: (*a, a[1].long()))),
        (ValueError, "k must be in", raw("indexer_topk", at(2, 0))),
        (ValueError, r"k must be in \[1, 4096\], got -1", lambda d: tsd.indexer_topk(*scores3(d, 3, 50), -1)),
        (TypeError, "k must be an int, got float", lambda d: tsd.indexer_topk(*scores3(d, 3, 50), 2.0)),
        (TypeError, "k must be an int, got bool", lambda d: tsd.indexer_topk(*scores3(d, 3, 50), True)),
        (ValueError, "out must have k = 15 columns", raw("indexer_topk", at(2, 15))),
        (ValueError, "out must not overlap lengths",
         lambda d: (lambda n: tsd.indexer_topk(rand(d, 3, 50), n, 1, out=n.view(3, 1)))(full(d, 3, 50))),
    ],
    "indexer_topk_fused": [
        (ValueError, "must cover the 400 columns", raw("indexer_topk_fused", at(6, lambda t: t[:, :24]))),
        (ValueError, "must cover the 100 columns", lambda d: fused(d, table=torch.zeros(2, 6, dtype=I32, device=d),
                                                                  page_size=16)),
        (ValueError, "pass page_table too", lambda d: fused(d, ids=empty(d, 2, 8, dtype=I32))),
        (ValueError, "page_size must be in", lambda d: fused(d, table=torch.zeros(2, 6, dtype=I32, device=d))),
        (TypeError, "values must have dtype float32", raw("indexer_topk_fused", at(5, lambda t: t.half()))),
        (ValueError, "ids must not overlap out|out must not overlap ids", _fused_aliased),
    ],
    "decode_row_lengths": [
        (TypeError, "seq_lens must have dtype int32", raw("decode_row_lengths", at(0, lambda t: t.long()))),
        (ValueError, r"next_n must be in \[1, 1024\]", raw("decode_row_lengths", at(1, 1025))),
        (ValueError, r"next_n must be in \[1, 1024\], got 0", lambda d: tsd.decode_row_lengths(full(d, 2, 4), 0)),
        (TypeError, "next_n must be an int", lambda d: tsd.decode_row_lengths(full(d, 2, 4), 2.0)),
        (ValueError, r"out must have shape \(6,\)", raw("decode_row_lengths", at(2, lambda t: t[:5]))),
        (ValueError, r"out must have shape \(4,\)",
         lambda d: tsd.decode_row_lengths(full(d, 2, 4), 2, out=empty(d, 5, dtype=I32))),
        (ValueError, "out must not overlap seq_lens", _rows_over_buffer),
        (ValueError, r"seq_lens.shape\[0\] \* next_n\) may have at most 65535 rows, got 4294967296",
         lambda d: tsd.decode_row_lengths(full(d, 1 << 22, 5), 1024)),
        (ValueError, "at most 65535 rows", lambda d: torch.ops.sparse_decode.decode_row_lengths(
            full(d, 21846, 1), 3, empty(d, 65538, dtype=I32))),
    ],
    "dcp_pack": [
        (ValueError, "world_size must be in", raw("dcp_pack", at(2, 17))),
        (ValueError, "rank must be in", raw("dcp_pack", at(3, 4))),
        (ValueError, "the one-round merge needs", raw("dcp_pack", at(4, 8))),
        (ValueError, "packed must", raw("dcp_pack", at(5, lambda t: t[:, :-1]))),
        (TypeError, "rescue must have dtype int32", raw("dcp_pack", at(6, lambda t: t.long()))),
        (TypeError, "topk must be an int, got str", lambda d: dcp.pack_candidates(*scores3(d), 2, 0, "128")),
        (ValueError, r"rank must be in \[0, 1\], got 2", lambda d: dcp.pack_candidates(*scores3(d), 2, 2, 256)),
        (ValueError, "scores may have at most 65535 rows, got 65536",
         lambda d: dcp.pack_candidates(*scores3(d, 65536, 4), 2, 0, 256)),
    ],
    "dcp_merge": [
        (ValueError, "gathered.shape", raw("dcp_merge", at(0, lambda t: t[:1]))),
        (ValueError, "rescue must have shape", raw("dcp_merge", at(1, lambda t: t[:, :, :-1].contiguous()))),
        (ValueError, "rank must be in", raw("dcp_merge", at(3, -1))),
        (ValueError, "local_count must have shape", raw("dcp_merge", at(6, lambda t: t[:2]))),
        (ValueError, r"topk must be in \[1, 4096\], got -1",
         lambda d: (lambda p, r: dcp.merge_packed(torch.stack([p] * 2), torch.stack([r] * 2), -1, 0))(*_packed(d))),
        (ValueError, "gathered must be a 3-D tensor", lambda d: dcp.merge_packed(*_packed(d), 256, 0)),
        (ValueError, r"topk must be in \[1, 4096\], got 0",
         lambda d: (lambda x, n: dcp.simulate_dcp_topk(x[None], n[None], 0))(*scores3(d))),
    ],
    "dcp_local_keys": [
        (TypeError, "keys must have dtype int64", raw("dcp_local_keys", at(5, lambda t: t.int()))),
        (ValueError, r"topk must be in \[1, 4096\], got -1", lambda d: dcp.local_topk_keys(*scores3(d), 2, 0, -1)),
        (ValueError, r"world_size must be in \[1, 16\], got 17",
         lambda d: dcp.local_topk_keys(*scores3(d), 17, 0, 256)),
        (ValueError, "scores may have at most 65535 rows, got 65536",
         lambda d: dcp.local_topk_keys(*scores3(d, 65536, 4), 2, 0, 256)),
    ],
    "dcp_merge_generic": [
        (TypeError, "gathered_keys must have dtype int64", raw("dcp_merge_generic", at(0, lambda t: t.int()))),
        (TypeError, "global_ids must have dtype int32", raw("dcp_merge_generic", at(2, lambda t: t.float()))),
        (ValueError, r"gathered_keys must be a 3-D tensor, got \(3, 4\)",
         lambda d: dcp.merge_generic(torch.zeros(3, 4, dtype=torch.int64, device=d), 0)),
        (ValueError, "global_ids must not overlap local_ids", _aliased_merge),
    ],
    "dcp_topk_merge": [
        (RuntimeError, "argument 'group_name'", raw("dcp_topk_merge", at(3, 7))),  # the dispatcher's schema check
        (ValueError, "topk must be in", raw("dcp_topk_merge", at(2, 0))),
        (ValueError, "global_ids must have shape", raw("dcp_topk_merge", at(4, lambda t: t[:2]))),
        (ValueError, r"topk must be in \[1, 4096\], got -1", lambda d: dcp.dcp_topk_merge(*scores3(d), -1, None)),
        (TypeError, "dcp_topk_merge: group must be a torch.distributed.ProcessGroup .* got str",
         lambda d: dcp.dcp_topk_merge(*scores3(d, 2, 9), 64, "0")),
    ],
    "init_dcp_topk_merge": [
        (TypeError, "timeout_s must be a float, got bool", init(64, 8, timeout_s=True)),
        (TypeError, "timeout_s must be a float, got str", init(64, 8, timeout_s="3")),
        (ValueError, "timeout_s must be a positive number", init(64, 8, timeout_s=0.0)),
        (TypeError, "max_rows must be an int, got float", init(64, 8.0)),
        (ValueError, r"max_rows must be in \[1, 65535\], got 0", init(2000, 0)),
        (ValueError, r"max_rows must be in \[1, 65535\], got 70000", init(2000, 70000)),
        (ValueError, r"max_local_len must be in \[1", init(64, 8, max_local_len=0)),
        (TypeError, "group must be a torch.distributed.ProcessGroup",
         lambda d: dcp.init_dcp_topk_merge("0", 64, 8)),
    ],
    "dcp_topk_merge_check": [
        (TypeError, "group must be a torch.distributed.ProcessGroup", lambda d: dcp.dcp_topk_merge_check(3)),
    ],
}


def _rows():
    for op, rows in TABLES.items():
        for i, (kind, match, call) in enumerate(rows):
            yield pytest.param(call, kind, match, id=f"{op}-{i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call,kind,match", list(_rows()))
def test_bad_argument_raises_naming_it(call, kind, match, device):
    one_rank_group()
    with pytest.raises(kind, match=match):
        call(device)


def test_every_op_has_a_table():
    assert set(tsd.registered_ops()) <= set(TABLES)


@pytest.mark.parametrize("device", DEVICES)
def test_numpy_integers_are_ints(device):
    x = torch.randn(3, 50, device=device)
    n = full(device, 3, 50)
    assert torch.equal(tsd.indexer_topk(x, n, np.int64(5)), tsd.indexer_topk(x, n, 5))
    assert torch.equal(tsd.select_candidate_blocks(x, n, np.int32(4), np.int64(3)),
                       tsd.select_candidate_blocks(x, n, 4, 3))
    s = torch.rand(2, 8, device=device)
    assert torch.equal(tsd.moe_route(s, torch.zeros(8, device=device), np.int64(2))[1],
                       tsd.moe_route(s, torch.zeros(8, device=device), 2)[1])
    assert torch.equal(dcp.local_topk_keys(x, n, np.int64(2), np.int64(1), np.int16(64)),
                       dcp.local_topk_keys(x, n, 2, 1, 64))


def test_dcp_init_takes_numpy_numbers():
    group = one_rank_group()
    assert dcp.init_dcp_topk_merge(group, np.int64(64), np.int64(8), max_local_len=np.int32(4096),
                                   timeout_s=np.float32(2.0)) == 0  # one rank: the generic merge
    assert dcp.init_dcp_topk_merge(group, 64, 8, max_local_len=4096, timeout_s=2.0) == 0  # the same call


def test_disjoint_parts_of_one_buffer_are_taken():
    s, b = torch.rand(2, 8), torch.zeros(8)
    buffer = torch.empty(2 * 2 * 2)
    tsd.moe_route(s, b, 2, out=(buffer[:4].view(2, 2), buffer[4:].view(I32).view(2, 2)))
