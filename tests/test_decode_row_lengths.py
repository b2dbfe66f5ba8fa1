"""decode_row_lengths: each MTP / next_n query row's valid length, against a plain loop, on the
CPU (the reference), on the GPU and in the Triton interpreter; in a CUDA graph; bad arguments."""

import os

import pytest
import torch

import torch_sparse_decode as tsd
from inputs import DEVICES, poisoned

SEQ_LENS = [0, 1, 2, 3, 4, 5, 17, 4096, 131072, 2**31 - 1, -1, -(2**31)]  # negative: bad input, length 0


def loop(seq_lens: list[int], next_n: int) -> torch.Tensor:
    return torch.tensor([max(s - next_n + j + 1, 0) for s in seq_lens for j in range(next_n)], dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 7, 1024])
def test_lengths_of_every_row(device, next_n):
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=device)
    out = poisoned((len(SEQ_LENS) * next_n,), torch.int32, device)
    assert tsd.decode_row_lengths(seq_lens, next_n, out=out) is out
    assert torch.equal(out.cpu(), loop(SEQ_LENS, next_n))
    assert torch.equal(tsd.decode_row_lengths(seq_lens, next_n).cpu(), loop(SEQ_LENS, next_n))


@pytest.mark.parametrize("device", DEVICES)
def test_large_and_empty_batches(device):
    gen = torch.Generator().manual_seed(3)
    seq_lens = torch.randint(0, 1 << 20, (21845,), generator=gen, dtype=torch.int32)  # 65535 rows: the most
    got = tsd.decode_row_lengths(seq_lens.to(device), 3).cpu()
    assert torch.equal(got, loop(seq_lens.tolist(), 3))
    assert tsd.decode_row_lengths(torch.empty(0, dtype=torch.int32, device=device), 2).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_feeds_indexer_topk(device):
    """Rows of one request see one more token each; an MTP step's top-k matches per-row slices."""
    gen = torch.Generator().manual_seed(4)
    seq_lens = torch.tensor([300, 2, 64], dtype=torch.int32, device=device)
    scores = torch.randn(6, 320, generator=gen).to(device)
    lengths = tsd.decode_row_lengths(seq_lens, 2)
    got = tsd.indexer_topk(scores, lengths, 8).cpu()
    for r, n in enumerate(loop([300, 2, 64], 2).tolist()):
        assert torch.equal(got[r], tsd.indexer_topk(scores[r:r + 1, :n], lengths[r:r + 1], 8)[0].cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_in_a_cuda_graph_with_new_inputs():
    seq_lens = torch.tensor([5, 9], dtype=torch.int32, device="cuda")
    out = torch.empty(8, dtype=torch.int32, device="cuda")
    tsd.decode_row_lengths(seq_lens, 4, out=out)  # compiles before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tsd.decode_row_lengths(seq_lens, 4, out=out)
    for new in ([3, 100], [0, 2**31 - 1], [4, 4]):
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(-7)
        graph.replay()
        assert torch.equal(out.cpu(), loop(new, 4))


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="interpreter run for CPU-only machines")
@pytest.mark.parametrize("next_n", [1, 3, 5])
def test_triton_kernel_in_the_interpreter(next_n):
    pytest.importorskip("triton", reason="triton not installed")
    from torch_sparse_decode.ops.decode_row_lengths import kernel
    seq_lens = torch.tensor(SEQ_LENS * 200, dtype=torch.int32)  # more than one program's rows
    out = torch.full((seq_lens.numel() * next_n,), -7, dtype=torch.int32)
    kernel.decode_row_lengths(seq_lens, next_n, out)
    assert torch.equal(out, loop(SEQ_LENS * 200, next_n))

