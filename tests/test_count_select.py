"""The count select (kernels/topk/count_select.py: short rows, one Triton program a row, the k-th
key found by counting), opted into with TORCH_SPARSE_DECODE_COUNT_SELECT=1 until it has run on
the GPU: which batches take it; exact against the oracle at every boundary of k, of the width and
of the switch, in every score dtype and every kind of scores, windowed, and for block keys with
the pinned newest block; in the CPU interpreter (CI) and on the GPU through ``indexer_topk`` and
``select_candidate_blocks`` (in a CUDA graph too, and the engine's ids)."""

import os

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import DEVICES, KINDS, poisoned, scores
from test_indexer_topk import window_edges
from test_short_row import assert_oracle_tokens, assert_takes_score_rows, routed
from torch_sparse_decode.kernels.topk import count_select, launch, short_row

COUNT_MAX = count_select.COUNT_MAX


@pytest.fixture
def switched_on(monkeypatch):
    monkeypatch.setattr(count_select, "COUNT_SELECT", True)


def edge_lengths(k: int, width: int) -> torch.Tensor:
    values = [-3, 0, 1, k - 1, k, k + 1, k + 2, width // 2, width - 1, width, width + 9]
    return torch.tensor(sorted({min(max(v, -3), width + 9) for v in values}), dtype=torch.int32)


def check(x, lengths, k, device, starts=None):
    """The path's ids (the kernel itself on the CPU, ``indexer_topk`` on the GPU) against the oracle."""
    out = poisoned((x.shape[0], k), torch.int32, device)
    if device == "cpu":
        count_select.count_select(x, lengths, starts, x.shape[1], k, out)
    else:
        tsd.indexer_topk(x.cuda(), lengths.cuda(), k, out=out, row_starts=None if starts is None else starts.cuda())
    assert_oracle_tokens(out, x, lengths, k, starts)
    return out.cpu()


def test_off_by_default():
    assert count_select.COUNT_SELECT == (os.environ.get("TORCH_SPARSE_DECODE_COUNT_SELECT") == "1")


def test_which_batches_take_it(monkeypatch):
    """Rows of at most COUNT_MAX scores or block keys, with or without the fused outputs, and the
    DCP pack's ord16 keys; everything else goes on as before."""
    monkeypatch.setattr(short_row, "SHORT_ROWS", False)  # the engine below, whatever the environment says
    taken = []
    monkeypatch.setattr(count_select, "count_select", lambda src, *a, **kw: taken.append("count"))
    monkeypatch.setattr(launch, "compiled", lambda *args, **kw: lambda *a: taken.append("engine"))
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    batch = routed(taken)
    monkeypatch.setattr(count_select, "COUNT_SELECT", False)
    assert batch(COUNT_MAX) == "engine"
    monkeypatch.setattr(count_select, "COUNT_SELECT", True)
    assert_takes_score_rows(batch, "count", COUNT_MAX, fused=True, ord16=True)
    assert batch(100, torch.float16, ord16=True) == "engine"  # ord16 keys of fp32 and bf16 scores only
    for blocks, path in ((COUNT_MAX, "count"), (COUNT_MAX + 1, "engine")):  # block keys, the newest block pinned
        launch.select(torch.zeros(2, blocks, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 8 * blocks, 8, 4,
                      torch.empty(2, 5, dtype=torch.int32), pinned=True)
        assert taken[-1] == path


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,width", [(1, 300), (7, 4097), (64, COUNT_MAX), (2048, 8192), (4096, COUNT_MAX - 1),
                                     (2048, 2000)])
def test_every_kind_and_boundary(switched_on, device, kind, k, width):
    lengths = edge_lengths(k, width)
    check(scores(kind, (lengths.numel(), width), seed=k), lengths, k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "relu_zeros", "all_equal", "tiny_negative", "nan_mixed",
                                  "inf_mixed", "signed_zeros"])
def test_half_precision(switched_on, device, dtype, kind):
    """bf16 / fp16 keys take 4 / 5 steps: the key bits below are cleared, the same in every key."""
    lengths = edge_lengths(512, 8192)
    check(scores(kind, (lengths.numel(), 8192), seed=5).to(dtype), lengths, 512, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed"])
@pytest.mark.parametrize("k", [1, 64, 2048])
def test_windows_and_unaligned_rows(switched_on, device, kind, k):
    width = COUNT_MAX - 50
    starts, ends = window_edges(k, width)
    x = scores(kind, (starts.numel(), width + 1), seed=k)[:, 1:]  # rows 4 bytes past 16-byte alignment
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    check(x, ends, k, device, starts)


def check_blocks(x, lengths, block, k, device, starts=None):
    """Block selection through the path (the block-key pass, then the count select: on the CPU both
    in the interpreter; on the GPU through ``select_candidate_blocks``) against the oracle."""
    out = poisoned((x.shape[0], k), torch.int32, device)
    if device == "cpu":
        from torch_sparse_decode.ops.select_candidate_blocks.kernel import block_keys

        keys = block_keys(x, lengths, block, keep_all=k if k > 1 else 1 << 30, starts=starts)
        count_select.count_select(keys, lengths, starts, x.shape[1], k - 1, out, block, pinned=True)
    else:
        tsd.select_candidate_blocks(x.cuda(), lengths.cuda(), block, k, out=out,
                                    row_starts=None if starts is None else starts.cuda())
    if starts is None:
        want = oracle.candidate_blocks(x.float(), lengths, block, k)
    else:
        want = oracle.windowed(oracle.candidate_blocks, x.float(), starts, lengths, block, k)
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "relu_zeros", "nan_mixed", "all_nan",
                                  "inf_mixed", "signed_zeros"])
@pytest.mark.parametrize("block,k", [(8, 2048), (8, 1), (64, 256), (1, 512), (3, 100)])
def test_block_keys_with_the_pinned_block(switched_on, device, kind, block, k):
    width = min(COUNT_MAX * block, 1 << 17) - 5
    keys = -(-width // block)
    lengths = torch.tensor(sorted({min(max(v * block, 0), width) for v in
                                   (0, 1, 2, k - 1, k, k + 1, k + 2, keys // 2, keys - 1, keys)} | {width - 3}),
                           dtype=torch.int32)
    check_blocks(scores(kind, (lengths.numel(), width), seed=block + k), lengths, block, k, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 64, 2048])
def test_block_keys_in_windows(switched_on, device, k):
    width = 8 * COUNT_MAX - 40
    starts, ends = window_edges(k * 8, width)
    x = scores("few_distinct", (starts.numel(), width), seed=k)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    check_blocks(x, ends, 8, k, device, starts)


@pytest.mark.gpu
def test_the_same_ids_as_the_engine(switched_on):
    """The rows of a batch one column too wide for the path (the engine) give the same ids."""
    lengths = edge_lengths(2048, COUNT_MAX).clamp(max=COUNT_MAX)
    x = scores("few_distinct", (lengths.numel(), COUNT_MAX), seed=3)
    counted = check(x, lengths, 2048, "cuda")
    wide = torch.cat([x, torch.full((x.shape[0], 1), float("inf"))], dim=1)  # never read: past every length
    assert torch.equal(counted, check(wide, lengths, 2048, "cuda"))


@pytest.mark.gpu
def test_in_a_cuda_graph(switched_on):
    from graphs import capture_graph, replay_matches

    lengths = edge_lengths(2048, 8192)
    x = scores("random", (lengths.numel(), 8192), seed=1).cuda()
    tsd.indexer_topk(x, lengths.cuda(), 2048)  # compiled before the capture
    graphed = capture_graph(lambda s, n: tsd.indexer_topk(s, n, 2048), x, lengths.cuda())
    fresh = [(scores(kind, tuple(x.shape), seed=9).cuda(), lengths.roll(i).cuda())
             for i, kind in enumerate(["random", "all_equal", "nan_mixed", "few_distinct"])]
    assert replay_matches(graphed, fresh, lambda s, n: oracle.topk_tokens(s.cpu(), n.cpu(), 2048)) == 4


def check_fused(x, lengths, k, device, page, raw, values, starts=None):
    """The fused outputs (the KV slots through a page table where ``page`` > 0, the raw ids, the
    values) of the path (the kernel itself on the CPU, ``indexer_topk_fused`` on the GPU) against
    the op's reference; ``page`` 0: ``out`` holds the ids."""
    from torch_sparse_decode.ops.indexer_topk_fused import reference

    rows = x.shape[0]
    entries = -(-x.shape[1] // max(page, 1))
    gen = torch.Generator().manual_seed(k)
    table = torch.randint(0, 1 << 20, (rows, entries), generator=gen, dtype=torch.int32) if page else None
    want = [torch.empty(rows, k, dtype=torch.int32) for _ in range(2)] + [torch.empty(rows, k, dtype=x.dtype)]
    reference.indexer_topk_fused(x, lengths, k, want[0], want[1], want[2], table, page, starts)
    if device == "cpu":
        got = [poisoned((rows, k), torch.int32, device) for _ in range(2)] + [poisoned((rows, k), x.dtype, device)]
        count_select.count_select(x, lengths, starts, x.shape[1], k, got[0], table=table, page=page,
                                  raw=got[1] if raw else None, values=got[2] if values else None)
    else:
        got = tsd.indexer_topk_fused(x.cuda(), lengths.cuda(), k, page_table=None if table is None else table.cuda(),
                                     page_size=page, ids=raw, values=values,
                                     row_starts=None if starts is None else starts.cuda())
    assert torch.equal(got[0].cpu(), want[0])
    if raw:
        assert torch.equal(got[1].cpu(), want[1])
    if values:
        bits = torch.int32 if x.dtype == torch.float32 else torch.int16
        assert torch.equal(got[2].cpu().view(bits), want[2].view(bits))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed", "signed_zeros"])
@pytest.mark.parametrize("page,raw,values", [(64, True, True), (1, False, True), (0, False, True), (16, True, False)])
def test_fused_outputs(switched_on, device, dtype, kind, page, raw, values):
    """Slots through the page table, raw ids and the values (the scores' own bits: NaN, -0.0), with
    -1, -1 and -inf padding; rows of at most k keys read for their values."""
    k = 300
    lengths = edge_lengths(k, 4000)
    check_fused(scores(kind, (lengths.numel(), 4000), seed=7).to(dtype), lengths, k, device, page, raw, values)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_outputs_in_windows(switched_on, device):
    width = 6000
    starts, ends = window_edges(64, width)
    x = scores("few_distinct", (starts.numel(), width), seed=2)
    check_fused(x, ends, 64, device, 32, True, True, starts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 100])
def test_fused_block_table(switched_on, device, k):
    """select_candidate_blocks_fused's path: block ids through the block table (page 1), the pinned
    newest block too, and the raw block ids."""
    from torch_sparse_decode.ops.indexer_topk_fused.reference import selected_outputs

    block, width = 8, 8 * 3000
    lengths = edge_lengths(k * block, width)
    x = scores("few_distinct", (lengths.numel(), width), seed=k)
    table = torch.randperm(1 << 16, generator=torch.Generator().manual_seed(1))[:lengths.numel() * 3000]
    table = table.view(lengths.numel(), 3000).int()
    want = [torch.empty(lengths.numel(), k, dtype=torch.int32) for _ in range(2)]
    selected_outputs(oracle.candidate_blocks(x, lengths, block, k), x, table, 1, want[0], want[1], None)
    if device == "cpu":
        from torch_sparse_decode.ops.select_candidate_blocks.kernel import block_keys

        got = [poisoned((lengths.numel(), k), torch.int32, device) for _ in range(2)]
        keys = block_keys(x, lengths, block, keep_all=k if k > 1 else 1 << 30)
        count_select.count_select(keys, lengths, None, width, k - 1, got[0], block, pinned=True, table=table, page=1,
                                  raw=got[1])
    else:
        got = tsd.select_candidate_blocks_fused(x.cuda(), lengths.cuda(), block, k, table.cuda(), ids=True)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "nan_mixed", "signed_zeros", "inf_mixed"])
@pytest.mark.parametrize("k,width", [(2048, 8192), (1024, COUNT_MAX), (64, 300)])
def test_ord16_keys(switched_on, device, dtype, kind, k, width):
    """The DCP pack's local select: scores ranked by their bf16 ord16 (fp32 rounded to nearest
    even), ties to the lower id, ids ascending (the pack's reference); on the GPU through the
    engine's entry, which the pack calls."""
    from dcp_cases import ascending_local_topk

    lengths = edge_lengths(k, width)
    x = scores(kind, (lengths.numel(), width), seed=k).to(dtype)
    out = poisoned((x.shape[0], k), torch.int32, device)
    if device == "cpu":
        count_select.count_select(x, lengths, None, width, k, out, ord16=True)
    else:
        launch.select_ord16(x.cuda(), lengths.cuda(), k, out)
    assert torch.equal(out.cpu(), ascending_local_topk(x, lengths, k))
