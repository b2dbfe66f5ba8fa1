"""Findings of a new user's 328 probes of every public function and raw op: each is fixed (and
tested here) or stated as a contract in the docs."""

import pytest
import torch

import torch_sparse_decode as tsd
from dcp_cases import one_rank_group
from test_registration import op_cases
from torch_sparse_decode import dcp, order


def _tensor_arguments():
    for name, args in op_cases("cpu").items():
        for at, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                yield pytest.param(name, at, id=f"{name}-{at}")


@pytest.mark.parametrize("name,at", list(_tensor_arguments()))
def test_a_tensor_on_another_device_is_refused(name, at):
    """Every tensor argument of every raw op, on the meta device beside CPU ones: a ValueError
    about devices. (dcp_topk_merge took a meta ``lengths`` silently: one meta input routes the
    call to the fake kernel, which only checks, and the outputs stayed uninitialised.)"""
    args = list(op_cases("cpu")[name])
    args[at] = torch.empty_like(args[at], device="meta")
    with pytest.raises(ValueError, match="device"):
        getattr(torch.ops.sparse_decode, name)(*args)


@pytest.mark.gpu
def test_device_mismatch_is_named():
    args = list(op_cases("cuda")["indexer_topk"])
    args[1] = args[1].cpu()
    with pytest.raises(ValueError, match="lengths must be on scores's device"):
        torch.ops.sparse_decode.indexer_topk(*args)


def test_dcp_topk_merge_names_lengths_on_another_device():
    scores = torch.randn(2, 100)
    with pytest.raises(ValueError, match="lengths must be on scores's device cpu, got meta"):
        dcp.dcp_topk_merge(scores, torch.full((2,), 100, dtype=torch.int32, device="meta"), 64, one_rank_group())


def test_an_output_inside_an_inputs_byte_range_but_apart_from_its_elements_is_taken():
    """The overlap check is exact: ``out`` in one column block of a buffer whose other columns
    hold the scores shares no element with them (it lay inside their byte range and was refused)."""
    buffer = torch.zeros(4, 96, dtype=torch.float32)
    scores = buffer[:, :64]
    scores.copy_(torch.randn(4, 64, generator=torch.Generator().manual_seed(0)))
    lengths = torch.full((4,), 64, dtype=torch.int32)
    out = buffer[1, 64:].view(torch.int32).view(4, 8)  # row 1's last 32 columns, between score rows
    assert out.data_ptr() < scores[2].data_ptr()
    tsd.indexer_topk(scores, lengths, 8, out=out)
    assert torch.equal(out, tsd.indexer_topk(scores.clone(), lengths, 8))
    with pytest.raises(ValueError, match="out must not overlap scores"):  # one shared element
        tsd.indexer_topk(scores, lengths, 8, out=buffer[1, 63:95].view(torch.int32).view(4, 8))


def test_outputs_interleaved_with_strided_inputs_are_taken():
    from torch_sparse_decode._library import check_no_overlap

    x = torch.zeros(64)
    check_no_overlap({"out": x[2:3]}, {"odd": x[1::2]})  # inside their byte range, on an even element
    with pytest.raises(ValueError, match="out must not overlap odd"):
        check_no_overlap({"out": x[2:4]}, {"odd": x[1::2]})
    check_no_overlap({"out": x[:0]}, {"all": x})  # empty outputs share nothing


def test_a_missing_default_group_is_named():
    """In a process without a default group (a fresh one: the tests' process has one)."""
    import subprocess
    import sys

    code = "from torch_sparse_decode import dcp; dcp.init_dcp_topk_merge(None, 64, 8)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ValueError: init_dcp_topk_merge: group is None and no default process group exists" in done.stderr


@pytest.mark.parametrize("op", ["indexer_topk", "select_candidate_blocks", "indexer_topk_fused",
                                "select_candidate_blocks_fused"])
def test_cpu_references_work_through_large_batches_in_chunks(op, monkeypatch):
    """The CPU references materialised int64 keys of the whole batch (65535 x 2**20 failed in the
    allocator): they now take CHUNK_ELEMENTS scores at a time, with the same answer."""
    seen = []
    keys = order.prefix_keys

    def spy(scores, ends):
        seen.append(scores.numel())
        return keys(scores, ends)

    args = op_cases("cpu")[op]
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    getattr(torch.ops.sparse_decode, op)(*want)
    width = args[0].shape[1]
    monkeypatch.setattr(order, "CHUNK_ELEMENTS", width)  # one row at a time
    for module in ("indexer_topk", "select_candidate_blocks"):
        monkeypatch.setattr(f"torch_sparse_decode.ops.{module}.reference.prefix_keys", spy)
    got = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    for t in got:
        if isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == 2 and t.shape[1] in (10, 16):
            t.fill_(-7)  # poisoned outputs
    getattr(torch.ops.sparse_decode, op)(*got)
    assert seen and max(seen) <= width
    for a, b in zip(got, want):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_moe_route_renormalizes_in_fp32_as_documented():
    """docs/ops.md promised a float64 sum; the reference and the kernel sum in fp32 (a warp's
    butterfly order), and the docs now say so: 1 + 2**-24 + 2**-24 rounds to 1 in fp32."""
    weights, ids = tsd.moe_route(torch.tensor([[1.0, 2**-24, 2**-24, 0.0]]), torch.zeros(4), 3)
    assert ids.tolist() == [[0, 1, 2]] and weights.tolist() == [[1.0, 2**-24, 2**-24]]
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "ops.md").read_text()
    assert "float64" not in doc and "[1.0, 5.96e-8, 5.96e-8]" in doc


def test_page_table_entries_are_used_as_given():
    """The documented contract (docs/ops.md): the op reads no table entry on the host, so a
    negative entry is not refused; it gives negative slots, -1 among them (the padding's value)."""
    scores = torch.arange(8, dtype=torch.float32)[None]  # position p scores p: the top 4 are 4..7
    table = torch.tensor([[0, -1]], dtype=torch.int32)  # pages of 4: positions 4..7 on page "-1"
    slots = tsd.indexer_topk_fused(scores, torch.tensor([8], dtype=torch.int32), 4, page_table=table,
                                   page_size=4).out
    assert slots.tolist() == [[-4, -3, -2, -1]]
