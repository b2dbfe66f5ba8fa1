"""The torch.library contract of every op: opcheck, torch.compile(fullgraph=True), argument checks."""

import importlib

import pytest
import torch

import torch_sparse_decode as tsd
from inputs import DEVICES
from dcp_cases import one_rank_group
from torch_sparse_decode import dcp
from torch_sparse_decode._library import cuda_kernels

CUDA_KERNELS = cuda_kernels()  # op -> the module of its CUDA kernel, from the registration


def op_cases(device):
    """(op, args) for every registered op, small shapes, outputs included."""
    gen = torch.Generator().manual_seed(0)
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    scores = torch.rand(5, 64, generator=gen).to(device)
    bias = torch.randn(64, generator=gen).to(device)
    logits = torch.randn(3, 500, generator=gen).to(device)
    ends = torch.tensor([500, 17, 0], **i32)
    tokens = torch.randn(3, 400, generator=gen).to(device)
    lengths = torch.tensor([400, 5, 0], **i32)
    packed, rescue = dcp.pack_candidates(tokens, lengths, 4, 1, 64)
    gathered, rescues = packed.expand(4, -1, -1).contiguous(), rescue.expand(4, -1, -1).contiguous()
    keys = dcp.local_topk_keys(tokens, lengths, 4, 1, 64).expand(4, -1, -1).contiguous()
    merged = lambda: (torch.empty(3, 64, **i32), torch.empty(3, 64, **i32), torch.empty(3, **i32))  # noqa: E731
    return {
        "moe_route": (scores, bias, 4, True, 1.5, False, 8, 4, torch.empty(5, 4, **f32), torch.empty(5, 4, **i32)),
        "moe_gate_route": (torch.randn(5, 96, generator=gen).bfloat16().to(device),
                           torch.randn(64, 96, generator=gen).bfloat16().to(device), bias, 4, True, 1.5, 8, 4,
                           torch.empty(5, 4, **f32), torch.empty(5, 4, **i32), torch.empty(5, 64, **f32)),
        "select_candidate_blocks": (logits, ends, 8, 10, torch.empty(3, 10, **i32)),
        "indexer_topk": (tokens, lengths, 16, torch.empty(3, 16, **i32)),
        "decode_row_lengths": (lengths, 2, torch.empty(6, **i32)),
        "select_candidate_blocks_fused": (logits, ends, 8, 10, torch.empty(3, 10, **i32), torch.empty(3, 10, **i32),
                                          torch.randint(0, 99, (3, 63), generator=gen).to(**i32)),
        "indexer_topk_fused": (tokens, lengths, 16, torch.empty(3, 16, **i32), torch.empty(3, 16, **i32),
                               torch.empty(3, 16, **f32), torch.randint(0, 99, (3, 26), generator=gen).to(**i32), 16),
        "dcp_pack": (tokens, lengths, 4, 1, 64, torch.empty_like(packed), torch.empty_like(rescue)),
        "dcp_merge": (gathered, rescues, 64, 2, *merged()),
        "dcp_local_keys": (tokens, lengths, 4, 1, 64, torch.empty(3, 64, dtype=torch.int64, device=device)),
        "dcp_merge_generic": (keys, 3, *merged()),
        "dcp_topk_merge": (tokens, lengths, 64, one_rank_group().group_name, *merged()),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_every_op_is_registered_and_passes_opcheck(device):
    cases = op_cases(device)
    assert set(cases) == set(tsd.registered_ops())
    for name, args in cases.items():
        torch.library.opcheck(getattr(torch.ops.sparse_decode, name).default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_row_starts_pass_opcheck(device):
    """The optional row_starts input of the two top-k ops (the cases above leave it out)."""
    cases = op_cases(device)
    starts = torch.tensor([3, 400, 1], dtype=torch.int32, device=device)
    for name in ("select_candidate_blocks", "indexer_topk"):
        torch.library.opcheck(getattr(torch.ops.sparse_decode, name).default, (*cases[name], starts))


def decode_step(router, bias, logits, ends, tokens, lengths, ranks_scores, ranks_lengths, group=None):
    weights, experts = tsd.moe_route(router, bias, 8, scale=2.0)
    grouped = tsd.moe_route(router.bfloat16(), bias, 8, scale=2.5, num_expert_group=8, topk_group=4,
                            out=(torch.empty(router.shape[0], 8, dtype=torch.bfloat16, device=router.device),
                                 torch.empty(router.shape[0], 8, dtype=torch.int32, device=router.device)))
    blocks = tsd.select_candidate_blocks(logits, ends, 64, 16)
    positions = tsd.indexer_topk(tokens, lengths, 32)
    windows = tsd.indexer_topk(tokens, lengths, 32, row_starts=lengths // 3)
    mtp = tsd.indexer_topk(tokens.repeat_interleave(2, dim=0), tsd.decode_row_lengths(lengths, 2), 32)
    world_size = ranks_scores.shape[0]
    rows = [dcp.pack_candidates(ranks_scores[r], ranks_lengths[r], world_size, r, 64) for r in range(world_size)]
    gathered = torch.stack([p for p, _ in rows])
    rescue = torch.stack([q for _, q in rows])
    global_ids, local_ids, count = dcp.merge_packed(gathered, rescue, 64, 1)
    keys = torch.stack(
        [dcp.local_topk_keys(ranks_scores[r], ranks_lengths[r], world_size, r, 64) for r in range(world_size)]
    )
    generic_ids = dcp.merge_generic(keys, 1)[0]
    # The full step over a (one-rank) process group, traced as one op with the group's name.
    step_ids = dcp.dcp_topk_merge(ranks_scores[0], ranks_lengths[0], 64, group)[0]
    return (weights, experts, blocks, positions, windows, mtp, global_ids, local_ids, count, generic_ids, step_ids,
            *grouped)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_step_compiles_without_graph_break(device):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    args = (
        torch.rand(4, 256, generator=gen),
        torch.randn(256, generator=gen) * 0.1,
        torch.randn(2, 4096, generator=gen),
        torch.tensor([4096, 1000], dtype=torch.int32),
        torch.randn(2, 3000, generator=gen).to(torch.bfloat16),
        torch.tensor([3000, 20], dtype=torch.int32),
        torch.randn(4, 2, 500, generator=gen),
        torch.tensor([[500, 3]] * 4, dtype=torch.int32),
    )
    args = tuple(a.to(device) for a in args)
    one_rank_group()
    compiled = torch.compile(decode_step, fullgraph=True)
    for got, want in zip(compiled(*args), decode_step(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(compiled(*args)[6], compiled(*args)[9])  # one-round == generic


BAD = []


def bad(name, mutate, exc, match):
    BAD.append(pytest.param(name, mutate, exc, match, id=f"{name}-{match.split()[0]}-{len(BAD)}"))


def _set(i, value):
    def mutate(args):
        args = list(args)
        args[i] = value(args[i]) if callable(value) else value
        return tuple(args)

    return mutate


bad("moe_route", _set(0, lambda t: t.double()), TypeError, "scores must have dtype float32")
bad("moe_route", _set(0, lambda t: t.t()), ValueError, "scores must be 2-D|scores must be contiguous|weights must")
bad("moe_route", _set(0, lambda t: torch.rand(5, 64, 2)[..., 0]), ValueError, "scores must be contiguous")
bad("moe_route", _set(1, lambda t: t[:10]), ValueError, "bias must have shape")
bad("moe_route", _set(1, lambda t: t.half()), TypeError, "bias must have dtype")
bad("moe_route", _set(2, 0), ValueError, "topk must be in")
bad("moe_route", _set(2, 33), ValueError, "topk must be in")
bad("moe_route", _set(8, lambda t: t[:, :3]), ValueError, "weights must")
bad("moe_route", _set(8, lambda t: t.half()), TypeError, "weights must have dtype float32")
bad("moe_route", _set(9, lambda t: t.long()), TypeError, "ids must have dtype int32")
bad("moe_route", _set(6, 3), ValueError, r"num_expert_group \(3\) must divide the 64 experts")
bad("moe_route", _set(6, 0), ValueError, "num_expert_group must be in")
bad("moe_route", _set(6, 64), ValueError, r"num_expert_group must be in \[1, 32\]")
bad("moe_route", _set(7, 9), ValueError, r"topk_group must be in \[1, 8\]")
bad("moe_route", lambda a: (*a[:2], 9, *a[3:6], 8, 1, torch.empty(5, 9), torch.empty(5, 9, dtype=torch.int32)),
    ValueError, "topk must be <= topk_group . experts / num_expert_group = 8")
bad("moe_route", _set(0, lambda t: torch.rand(2, 2000)), ValueError, "scores must have 1 to 1024 experts")
bad("moe_route", _set(4, float("nan")), ValueError, "scale must be finite")
bad("moe_route", _set(4, float("inf")), ValueError, "scale must be finite")
bad("select_candidate_blocks", _set(0, lambda t: t.double()), TypeError,
    "logits must have dtype float32 or bfloat16 or float16")
bad("select_candidate_blocks", _set(0, lambda t: t[:, ::2]), ValueError, "logits must have unit stride")
bad("select_candidate_blocks", _set(1, lambda t: t.long()), TypeError, "lengths must have dtype int32")
bad("select_candidate_blocks", _set(1, lambda t: t[:2]), ValueError, "lengths must have shape")
bad("select_candidate_blocks", _set(2, 0), ValueError, "block_size must be in")
bad("select_candidate_blocks", _set(2, 257), ValueError, "block_size must be in")
bad("select_candidate_blocks", _set(4, lambda t: t[:2]), ValueError, "out must have 3 rows")
bad("select_candidate_blocks", _set(3, 4097), ValueError, "k must be in")
bad("select_candidate_blocks", _set(3, 9), ValueError, "out must have k = 9 columns")
bad("indexer_topk", _set(0, lambda t: t.double()), TypeError, "scores must have dtype float32 or bfloat16 or float16")
bad("indexer_topk", _set(1, lambda t: t.reshape(3, 1)), ValueError, "lengths must be 1-D")
bad("indexer_topk", lambda a: (*a, a[1].long()), TypeError, "row_starts must have dtype int32")
bad("select_candidate_blocks", lambda a: (*a, a[1][:2]), ValueError, "row_starts must have shape")
bad("decode_row_lengths", _set(0, lambda t: t.long()), TypeError, "seq_lens must have dtype int32")
bad("indexer_topk_fused", _set(6, lambda t: t[:, :24]), ValueError, "must cover the 400 columns")
bad("indexer_topk_fused", _set(5, lambda t: t.half()), TypeError, "values must have dtype float32")
bad("decode_row_lengths", _set(1, 1025), ValueError, r"next_n must be in \[1, 1024\]")
bad("decode_row_lengths", _set(2, lambda t: t[:5]), ValueError, r"out must have shape \(6,\)")
bad("indexer_topk", _set(2, 15), ValueError, "out must have k = 15 columns")
bad("indexer_topk", _set(2, 0), ValueError, "k must be in")
bad("indexer_topk", _set(0, lambda t: torch.empty(3, (1 << 20) + 1)), ValueError, "scores may have at most")
bad("indexer_topk", lambda a: (torch.empty(65536, 4), torch.zeros(65536, dtype=torch.int32), 16,
                               torch.empty(65536, 16, dtype=torch.int32)),
    ValueError, "scores may have at most 65535 rows")
bad("dcp_pack", _set(2, 17), ValueError, "world_size must be in")
bad("dcp_pack", _set(3, 4), ValueError, "rank must be in")
bad("dcp_pack", _set(4, 8), ValueError, "the one-round merge needs")
bad("dcp_pack", _set(5, lambda t: t[:, :-1]), ValueError, "packed must")
bad("dcp_pack", _set(6, lambda t: t.long()), TypeError, "rescue must have dtype int32")
bad("dcp_merge", _set(0, lambda t: t[:1]), ValueError, "gathered.shape")
bad("dcp_merge", _set(1, lambda t: t[:, :, :-1].contiguous()), ValueError, "rescue must have shape")
bad("dcp_merge", _set(3, -1), ValueError, "rank must be in")
bad("dcp_merge", _set(6, lambda t: t[:2]), ValueError, "local_count must have shape")
bad("dcp_local_keys", _set(5, lambda t: t.int()), TypeError, "keys must have dtype int64")
bad("dcp_merge_generic", _set(0, lambda t: t.int()), TypeError, "gathered_keys must have dtype int64")
bad("dcp_merge_generic", _set(2, lambda t: t.float()), TypeError, "global_ids must have dtype int32")
bad("dcp_topk_merge", _set(3, 7), RuntimeError, "argument 'group_name'")  # the dispatcher's schema check
bad("dcp_topk_merge", _set(2, 0), ValueError, "topk must be in")
bad("dcp_topk_merge", _set(4, lambda t: t[:2]), ValueError, "global_ids must have shape")


@pytest.mark.parametrize("name,mutate,exc,match", BAD)
def test_bad_argument_raises_naming_it(name, mutate, exc, match):
    args = mutate(op_cases("cpu")[name])
    with pytest.raises(exc, match=match):
        getattr(torch.ops.sparse_decode, name)(*args)


@pytest.mark.gpu
def test_device_mismatch_is_named():
    args = list(op_cases("cuda")["indexer_topk"])
    args[1] = args[1].cpu()
    with pytest.raises(ValueError, match="lengths must be on scores's device"):
        torch.ops.sparse_decode.indexer_topk(*args)


def test_wrappers_check_scalar_types():
    s, b = torch.rand(2, 8), torch.zeros(8)
    with pytest.raises(TypeError, match="topk must be an int"):
        tsd.moe_route(s, b, 2.0)
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        tsd.moe_route(s, b, 2, renormalize=1)
    with pytest.raises(TypeError, match="scale must be a float"):
        tsd.moe_route(s, b, 2, scale="x")
    with pytest.raises(TypeError, match="k must be an int"):
        tsd.indexer_topk(s, torch.zeros(2, dtype=torch.int32), 4.0)
    with pytest.raises(TypeError, match="block_size must be an int"):
        tsd.select_candidate_blocks(s, torch.zeros(2, dtype=torch.int32), True, 4)


def test_wrappers_check_before_allocating():
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        tsd.indexer_topk([1.0, 2.0], torch.zeros(1, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="topk must be in"):
        tsd.moe_route(torch.rand(2, 8), torch.zeros(8), 9)
    with pytest.raises(ValueError, match="out must have k = 4 columns"):
        tsd.select_candidate_blocks(torch.rand(2, 8), torch.zeros(2, dtype=torch.int32), 2, 4,
                                    out=torch.empty(2, 5, dtype=torch.int32))


def test_warmup_runs_every_op_but_the_process_group_step():
    """warmup() runs each op once (on the CPU: each reference) and touches no process group, so
    the full DCP step is the one op it leaves to init_dcp_topk_merge."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = set()

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "sparse_decode":
                ran.add(func._opname)
            return func(*args, **(kwargs or {}))

    with Spy():
        assert tsd.warmup("cpu") >= 1
    assert set(tsd.registered_ops()) - ran == {"dcp_topk_merge"}


def test_import_and_cpu_ops_need_no_kernel_toolkit():
    """`import torch_sparse_decode` and every CPU op work where CuTe DSL and Triton are missing."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('triton', 'cutlass', 'tvm_ffi'):\n"
        "    sys.modules[name] = None  # makes `import name` fail\n"
        "import torch_sparse_decode as tsd\n"
        "from torch_sparse_decode.demo import run_examples\n"
        "import torch\n"
        "rows = run_examples(torch.device('cpu'), check=True)\n"
        "assert all(r['ok'] for r in rows), rows\n"
        "assert not any(m in sys.modules and sys.modules[m] is not None for m in ('triton', 'cutlass'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_op_but_the_host_side_ones_has_a_cuda_kernel():
    """The two ops without one run their reference on CUDA by design (small host-facing
    helpers of the generic DCP merge)."""
    assert set(tsd.registered_ops()) - set(CUDA_KERNELS) == {"dcp_local_keys", "dcp_merge_generic"}


@pytest.mark.parametrize("op", sorted(CUDA_KERNELS))
def test_cuda_kernel_module_contract(op):
    """Each op's kernel module defines the op's function, and ``warm`` (what warmup() calls on
    CUDA) is a function where it has one."""
    module = importlib.import_module(CUDA_KERNELS[op])
    assert callable(getattr(module, op)) and callable(getattr(module, "warm", print))
