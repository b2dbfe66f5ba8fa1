"""The Triton top-k engine on CPU tensors under TRITON_INTERPRET=1 (CI has no GPU), against the
oracle: multi-level trees, every adversarial kind, boundary lengths, pinned blocks."""

import os

import pytest
import torch

import oracle
from inputs import KINDS, poisoned, scores

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="interpreter run for CPU-only machines; GPU tests cover the compiled kernels",
)
topk = pytest.importorskip("torch_sparse_decode.kernels.topk", reason="triton not installed")


def run_tokens(x, lengths, k):
    out = poisoned((x.shape[0], k), torch.int32, "cpu")
    topk.indexer_topk(x, lengths, k, out)
    return out


def run_blocks(x, ends, block_size, k):
    out = poisoned((x.shape[0], k), torch.int32, "cpu")
    topk.select_candidate_blocks(x, ends, block_size, out)
    return out


def test_plans_shrink_each_level_and_end_in_one_chunk():
    assert topk.levels_for(0, 300, 1, 64) == (1, [(300, 512, 64)])
    for mode, width, block, k_sel in [(0, 1 << 20, 1, 2048), (0, 1 << 20, 1, 4096), (1, 1 << 20, 64, 2047),
                                      (1, 1 << 20, 8, 2047), (1, 5000, 3, 0), (0, 70000, 1, 4096)]:
        _, levels = topk.levels_for(mode, width, block, k_sel)
        assert levels[-1][0] <= levels[-1][1]
        for (n, chunk, keep), (n_next, _, _) in zip(levels, levels[1:]):
            assert n_next == -(-n // chunk) * keep and (n_next < n or chunk <= k_sel + 1)
        assert len(levels) <= 5


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_two_levels(kind):
    width = 40000
    lengths = torch.tensor([width, 16384, 16385, 100, 0, 32769], dtype=torch.int32)
    x = scores(kind, (6, width), seed=3)
    assert torch.equal(run_tokens(x, lengths, 100), oracle.topk_tokens(x, lengths, 100))


@pytest.mark.parametrize("kind", ["random", "all_equal", "relu_zeros", "signed_zeros", "bf16_plateau"])
def test_tokens_bf16(kind):
    x = scores(kind, (3, 20000), seed=4).to(torch.bfloat16)
    lengths = torch.tensor([20000, 63, 64], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 64), oracle.topk_tokens(x.float(), lengths, 64))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_size", [1, 3, 8, 64, 256])
def test_blocks_every_edge(kind, block_size):
    k = 40
    width = 300 * block_size + 5
    bs = block_size
    ends = torch.tensor([width, 0, 1, bs - 1, bs, bs + 1, (k - 1) * bs, k * bs, k * bs + 1, width + 9, -4],
                        dtype=torch.int32).clamp(max=width + 9)
    x = scores(kind, (ends.numel(), width), seed=block_size)
    assert torch.equal(run_blocks(x, ends, block_size, k), oracle.candidate_blocks(x, ends, block_size, k))


def test_three_level_tree_at_decode_size():
    width = 1 << 20
    x = scores("relu_zeros", (1, width), seed=5)
    lengths = torch.tensor([width - 3], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 2048), oracle.topk_tokens(x, lengths, 2048))


def test_blocks_at_decode_size():
    width = 1 << 19
    x = scores("bf16_plateau", (1, width), seed=6)
    ends = torch.tensor([width - 77], dtype=torch.int32)
    assert torch.equal(run_blocks(x, ends, 8, 2048), oracle.candidate_blocks(x, ends, 8, 2048))


def test_k_of_one_block_is_the_pinned_block():
    x = scores("random", (2, 100), seed=7)
    ends = torch.tensor([100, 9], dtype=torch.int32)
    assert run_blocks(x, ends, 8, 1).tolist() == [[12], [1]]


@pytest.mark.parametrize("width", [0, 1, 2])
def test_tiny_widths(width):
    x = scores("random", (3, width), seed=8)
    ends = torch.tensor([width, 0, width + 4], dtype=torch.int32)
    assert torch.equal(run_tokens(x, ends, 3), oracle.topk_tokens(x, ends, 3))
    assert torch.equal(run_blocks(x, ends, 2, 3), oracle.candidate_blocks(x, ends, 2, 3))
