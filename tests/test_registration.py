"""The torch.library contract of every op: opcheck and torch.compile(fullgraph=True). (Bad arguments:
test_bad_arguments.py.)"""

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
        "import torch.distributed as dist\n"
        "assert not dist.is_initialized(), 'the demo left its process group to interpreter exit'\n"
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
    """Each op's kernel module defines the op's function, and ``warm_triton`` and ``warm`` (what
    warmup() calls on CUDA) are functions where it has them."""
    module = importlib.import_module(CUDA_KERNELS[op])
    assert callable(getattr(module, op))
    assert all(callable(getattr(module, hook, print)) for hook in ("warm", "warm_triton"))
