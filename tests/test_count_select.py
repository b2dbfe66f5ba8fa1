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
import select_checks
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
    select_checks.check_blocks(scores(kind, (lengths.numel(), width), seed=block + k), lengths, block, k, device,
                               cpu=count_select.count_select)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 64, 2048])
def test_block_keys_in_windows(switched_on, device, k):
    width = 8 * COUNT_MAX - 40
    starts, ends = window_edges(k * 8, width)
    x = scores("few_distinct", (starts.numel(), width), seed=k)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    select_checks.check_blocks(x, ends, 8, k, device, starts, cpu=count_select.count_select)


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed", "signed_zeros"])
@pytest.mark.parametrize("page,raw,values", [(64, True, True), (1, False, True), (0, False, True), (16, True, False)])
def test_fused_outputs(switched_on, device, dtype, kind, page, raw, values):
    """Slots through the page table, raw ids and the values (the scores' own bits: NaN, -0.0), with
    -1, -1 and -inf padding; rows of at most k keys read for their values."""
    k = 300
    lengths = edge_lengths(k, 4000)
    x = scores(kind, (lengths.numel(), 4000), seed=7).to(dtype)
    select_checks.check_fused(x, lengths, k, device, page, raw, values, cpu=count_select.count_select)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_outputs_in_windows(switched_on, device):
    width = 6000
    starts, ends = window_edges(64, width)
    x = scores("few_distinct", (starts.numel(), width), seed=2)
    select_checks.check_fused(x, ends, 64, device, 32, True, True, starts, cpu=count_select.count_select)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 100])
def test_fused_block_table(switched_on, device, k):
    select_checks.check_fused_block_table(k, device, cpu=count_select.count_select)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "nan_mixed", "signed_zeros", "inf_mixed"])
@pytest.mark.parametrize("k,width", [(2048, 8192), (1024, COUNT_MAX), (64, 300)])
def test_ord16_keys(switched_on, device, dtype, kind, k, width):
    select_checks.check_ord16(dtype, kind, k, width, device, cpu=count_select.count_select)
