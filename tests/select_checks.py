"""Op-level GPU checks of the short-row select (kernels/topk/short_row.py) for every user of the
engine besides ``indexer_topk``: block selection with the pinned newest block, the fused outputs,
the fused block table, the DCP pack's ord16 keys. Each runs through the op (whichever path
``launch.select`` takes)."""

import torch

import oracle
import torch_sparse_decode as tsd
from inputs import poisoned, scores


def check_blocks(x, lengths, block, k, starts=None):
    """Block selection (the block-key pass, then the path) against the oracle."""
    out = poisoned((x.shape[0], k), torch.int32, "cuda")
    tsd.select_candidate_blocks(x.cuda(), lengths.cuda(), block, k, out=out,
                                row_starts=None if starts is None else starts.cuda())
    if starts is None:
        want = oracle.candidate_blocks(x.float(), lengths, block, k)
    else:
        want = oracle.windowed(oracle.candidate_blocks, x.float(), starts, lengths, block, k)
    assert torch.equal(out.cpu(), want)


def check_fused(x, lengths, k, page, raw, values, starts=None):
    """The fused outputs (the KV slots through a page table where ``page`` > 0, the raw ids, the
    values; through ``indexer_topk_fused``) against the op's reference; ``page`` 0:
    ``out`` holds the ids."""
    from torch_sparse_decode.ops.indexer_topk_fused import reference

    rows = x.shape[0]
    entries = -(-x.shape[1] // max(page, 1))
    gen = torch.Generator().manual_seed(k)
    table = torch.randint(0, 1 << 20, (rows, entries), generator=gen, dtype=torch.int32) if page else None
    want = [torch.empty(rows, k, dtype=torch.int32) for _ in range(2)] + [torch.empty(rows, k, dtype=x.dtype)]
    reference.indexer_topk_fused(x, lengths, k, want[0], want[1], want[2], table, page, starts)
    got = tsd.indexer_topk_fused(x.cuda(), lengths.cuda(), k, page_table=None if table is None else table.cuda(),
                                 page_size=page, ids=raw, values=values,
                                 row_starts=None if starts is None else starts.cuda())
    assert torch.equal(got[0].cpu(), want[0])
    if raw:
        assert torch.equal(got[1].cpu(), want[1])
    if values:
        bits = torch.int32 if x.dtype == torch.float32 else torch.int16
        assert torch.equal(got[2].cpu().view(bits), want[2].view(bits))


def check_fused_block_table(k):
    """select_candidate_blocks_fused's outputs: block ids through the block table (page 1), the
    pinned newest block too, and the raw block ids."""
    from test_short_row import edge_lengths
    from torch_sparse_decode.ops.indexer_topk_fused.reference import selected_outputs

    block, width = 8, 8 * 3000
    lengths = edge_lengths(k * block, width)
    x = scores("few_distinct", (lengths.numel(), width), seed=k)
    table = torch.randperm(lengths.numel() * 3000, generator=torch.Generator().manual_seed(1))
    table = table.view(lengths.numel(), 3000).int()  # distinct entries: a wrong block shows
    want = [torch.empty(lengths.numel(), k, dtype=torch.int32) for _ in range(2)]
    selected_outputs(oracle.candidate_blocks(x, lengths, block, k), x, table, 1, want[0], want[1], None)
    got = tsd.select_candidate_blocks_fused(x.cuda(), lengths.cuda(), block, k, table.cuda(), ids=True)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def check_ord16(dtype, kind, k, width, edges=None):
    """The DCP pack's local select: scores ranked by their bf16 ord16 (fp32 rounded to nearest
    even), ties to the lower id, ids ascending (the pack's reference); on the GPU through the
    engine's entry, which the pack calls. ``edges(k, width)``: the rows' lengths (by default
    ``test_short_row.edge_lengths``)."""
    from dcp_cases import ascending_local_topk
    from test_short_row import edge_lengths
    from torch_sparse_decode.kernels.topk import launch

    lengths = (edges or edge_lengths)(k, width)
    x = scores(kind, (lengths.numel(), width), seed=k).to(dtype)
    out = poisoned((x.shape[0], k), torch.int32, "cuda")
    launch.select_ord16(x.cuda(), lengths.cuda(), k, out)
    assert torch.equal(out.cpu(), ascending_local_topk(x, lengths, k))
