"""The CUDA top-k engine at the sizes that exercise its machinery: every cluster size (1-8 CTAs
per row), spans of many tiles, ties and NaN/inf that
straddle the CTAs of a row, k up to 4096, bf16, pinned blocks. Bit-identical to the oracle."""

import pytest
import torch

import oracle
import torch_sparse_decode as tsd
from inputs import KINDS, poisoned, scores

pytestmark = pytest.mark.gpu
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl not installed")
pytest.importorskip("triton", reason="triton not installed")
from torch_sparse_decode.kernels import topk  # noqa: E402

# Widths whose cluster sizes are 1, 2, 4 and 8 CTAs per row, for ROWS rows per call.
WIDTHS = [6000, 12000, 30000, 300000]
ROWS = 6


def cluster_size(rows: int, width: int) -> int:
    return topk.cluster_size(rows, width, topk.sm_count(torch.device("cuda", torch.cuda.current_device())))


def run_tokens(x, lengths, k, rows_per_call=None):
    out = poisoned((x.shape[0], k), torch.int32, "cuda")
    step = rows_per_call or max(x.shape[0], 1)
    for a in range(0, x.shape[0], step):
        tsd.indexer_topk(x[a:a + step].cuda(), lengths[a:a + step].cuda(), k, out=out[a:a + step])
    return out.cpu()


def run_blocks(x, ends, block_size, k):
    out = poisoned((x.shape[0], k), torch.int32, "cuda")
    tsd.select_candidate_blocks(x.cuda(), ends.cuda(), block_size, k, out=out)
    return out.cpu()


def span_edges(width: int, k: int) -> list[int]:
    """Lengths at the edges of the CTA spans and of the streamed tiles, plus the usual ones."""
    ranks = cluster_size(ROWS, width)
    edges = [0, 1, k - 1, k, k + 1, width, width - 1, ranks * k, ranks * k + 1]
    edges += [ranks * topk.TILE, ranks * topk.TILE + 1, ranks * 3 * topk.TILE - 1, ranks * 5 * topk.TILE + 7]
    return sorted({min(max(v, 0), width) for v in edges})[:12]


def test_cluster_sizes_cover_one_to_eight():
    assert [cluster_size(ROWS, w) for w in WIDTHS] == [1, 2, 4, 8]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", KINDS)
def test_tokens_every_kind_every_cluster_size(width, kind):
    k = 2048
    lengths = torch.tensor(span_edges(width, k), dtype=torch.int32)
    x = scores(kind, (lengths.numel(), width), seed=width % 97)
    assert torch.equal(run_tokens(x, lengths, k, ROWS), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("k", [1, 2, 511, 1024, 4095, 4096])
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "relu_zeros"])
def test_tokens_k_range(k, kind):
    width = 150000
    lengths = torch.tensor([width, k, k + 1, 70001, 3 * topk.TILE + 5], dtype=torch.int32)
    x = scores(kind, (lengths.numel(), width), seed=k)
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "tiny_negative", "nan_mixed"])
def test_tokens_bf16_clusters(kind):
    width = 300000
    x = scores(kind, (4, width), seed=3).to(torch.bfloat16)
    lengths = torch.tensor([width, 100000, 8193, 40000], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 2048), oracle.topk_tokens(x.float(), lengths, 2048))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [12001, 300001])
def test_tokens_unaligned_views(dtype, width):
    """Rows that start anywhere in memory (a view one element in, an odd row stride): the engine's
    16-byte copies start before a span and read nothing past it. Lengths at the spans' and tiles'
    edges, so spans start at every alignment."""
    x = scores("random", (ROWS, width + 2), seed=width % 89).to(dtype).cuda()[:, 1:width + 1]
    lengths = torch.tensor(span_edges(width, 2048)[-ROWS:], dtype=torch.int32)
    assert x.stride(0) % 2 == 1 and x.data_ptr() % 16 != 0
    assert torch.equal(run_tokens(x, lengths, 2048, ROWS), oracle.topk_tokens(x.float().cpu(), lengths, 2048))


def test_monotone_and_periodic_rows():
    """Scores rising, falling and periodic along the row."""
    width = 300000
    x = torch.arange(width, dtype=torch.float32).repeat(3, 1)
    x[1] = -x[1]
    x[2] = (x[2] % 7)  # periodic plateaus
    lengths = torch.tensor([width, width, width - 5], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 2048), oracle.topk_tokens(x, lengths, 2048))


def sample_chunks(width: int, ranks: int, dtype: torch.dtype, first_only: bool = False) -> torch.Tensor:
    """The columns of the one-read path's second gate sample on full rows of an aligned tensor:
    one 16-byte chunk a thread, spread evenly over each CTA's span (``first_only``: the first
    column of each chunk inside the span)."""
    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    span = -(-width // ranks)
    cols = []
    for r in range(ranks):
        lo, hi = min(r * span, width), min((r + 1) * span, width)
        for tid in range(topk.THREADS):
            at = lo + tid * (hi - lo) // topk.THREADS
            at -= at % vec
            cols.append(torch.arange(max(at, lo), min(at + (1 if first_only else vec), hi)))
    return torch.unique(torch.cat(cols))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_gates_that_fail(dtype):
    """Spans of > ONE_READ_FROM keys take the one-read path: each CTA copies its keys above a gate
    guessed from its first tile; where that fails, the CTAs whose copies lack keys >= t copy
    again with a gate from a sample of their span. Rows built so that the guesses fail every way
    must stay exact. Tile 0's guess fails and the sample's holds: a gate above the k-th key (a
    CTA's first tile far above the rest of the row), a copy that overflows (rising rows, a first
    tile far below), too few copied (falling rows). Both fail (two passes): a rising row whose
    sample sits far below (both copies overflow), a rising row whose first CTA's sample holds
    keys far above (fewer than k: that CTA keeps its tile-0 copy, whose gate is above t). And
    rows where tile 0's guess holds (all keys equal: the gate is their value), one with the whole
    top k in a window of a few warps' parts of one CTA's tiles (large parts to put in index
    order)."""
    width = 1 << 19
    assert cluster_size(5, width) == 8 and width // 8 > topk.ONE_READ_FROM  # calls of <= 5 rows
    span = width // 8
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(5))
    x[6, 200000:203000] += 20.0
    x[1, span:span + topk.TILE] += 100.0  # CTA 1's first tile holds the whole top k
    x[2] = torch.arange(width, dtype=torch.float32)
    x[3] = -torch.arange(width, dtype=torch.float32)
    x[4, ::span] = -1e30  # ... every CTA's first key sits far below
    x[4].view(8, span)[:, :topk.TILE] -= 50.0  # and so does its first tile
    x[5] = 0.5
    x[7] = torch.arange(width, dtype=torch.float32)
    x[7, sample_chunks(width, 8, dtype)] = -1e30
    x[8] = torch.arange(width, dtype=torch.float32)
    firsts = sample_chunks(width, 8, dtype, first_only=True)
    x[8, firsts[firsts < span]] = 1e9 + torch.arange(int((firsts < span).sum()), dtype=torch.float32)
    x = x.to(dtype)
    lengths = torch.full((9,), width, dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 2048, 5), oracle.topk_tokens(x.float(), lengths, 2048))


@pytest.mark.parametrize("rows", [4, 64])
def test_one_read_path_taken_where_it_should_be(rows):
    """The profiled build's phase marks show the path each CTA took: a random long row is answered
    from the copies (no first-digit pass over the row) at the first attempt; rising and falling
    rows fail it (tile 0 is not like the rest of the span) and are answered from the copies of
    the second, sample-gated attempt; a rising row whose sample sits far below overflows both
    and takes the two passes. A fast path that silently stopped being taken would fail here."""
    width, k = 1 << 19, 2048
    ranks = cluster_size(rows, width)
    assert width // ranks > topk.ONE_READ_FROM
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(9))
    x[1] = torch.arange(width, dtype=torch.float32)
    x[2] = -torch.arange(width, dtype=torch.float32)
    x[3] = torch.arange(width, dtype=torch.float32)
    x[3, sample_chunks(width, ranks, torch.float32)] = -1e30
    lengths = torch.full((rows,), width, dtype=torch.int32)
    out = poisoned((rows, k + 1 + ranks * topk.PROFILE_SLOTS), torch.int32, "cuda")
    n = lengths.cuda()
    none = torch.empty(0, 0, device="cuda")
    topk.compiled(torch.float32, False, ranks, profile=True)(x.cuda(), n, n, 0, width, 1, k, out, out, out, 0, none, 0)
    ends = out[:, k + 1:].reshape(rows, ranks, topk.PROFILE_SLOTS)[..., :len(topk.PHASES)].cpu()
    gated, failed, from_copies, first_digit = (
        ends[..., topk.PHASES.index(name)] > 0
        for name in ("gated pass + index order", "first attempt failed", "digits from the copies", "first-digit pass"))
    assert gated.all()
    plain = [0] + list(range(4, rows))
    assert from_copies[plain].all() and not failed[plain].any() and not first_digit[plain].any()
    assert failed[1:3].all() and from_copies[1:3].all() and not first_digit[1:3].any()
    assert failed[3].all() and first_digit[3].all()
    assert torch.equal(out[:, :k].cpu(), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("k", [1, 2, 511, 2048, 4096])
@pytest.mark.parametrize("kind", ["random", "few_distinct", "relu_zeros", "nan_mixed"])
def test_one_read_k_range(k, kind):
    """The one-read path over the range of k: each CTA's share of k sets its gate (k = 1 copies
    about two keys per CTA; k = 4096 fills the copies most), with ties and NaN on the way."""
    width = 1 << 19
    assert cluster_size(4, width) == 8 and width // 8 > topk.ONE_READ_FROM
    x = scores(kind, (4, width), seed=k)
    edge = 8 * topk.ONE_READ_FROM  # longer rows take the one-read path, this one does not
    lengths = torch.tensor([width, edge + 1, edge, 7 * width // 8 + 3], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("block_size", [1, 3, 8, 64, 256])
@pytest.mark.parametrize("kind", ["random", "all_equal", "relu_zeros", "nan_mixed", "all_nan", "inf_mixed"])
def test_blocks_clusters(block_size, kind):
    k = 2048
    n_blocks = 300000 // block_size if block_size < 64 else 4000
    width = n_blocks * block_size + 3
    bs = block_size
    ends = torch.tensor([width, 0, 1, bs, bs + 1, k * bs, (k + 1) * bs + 1, width // 2, width + 7], dtype=torch.int32)
    x = scores(kind, (ends.numel(), width), seed=block_size)
    assert torch.equal(run_blocks(x, ends, block_size, k), oracle.candidate_blocks(x, ends, block_size, k))


def test_many_rows_small_clusters():
    width = 200000
    x = scores("few_distinct", (300, width), seed=11)
    lengths = torch.randint(0, width + 1, (300,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, 2048), oracle.topk_tokens(x, lengths, 2048))


def vllm_batch(kind: str, k: int, width: int, m: int, rows: int = 65):
    """vLLM's test_persistent_topk_sampled_graph rows: lengths cycling through the boundaries, NaN
    past each row's end; rows descending, or zeros with 4096 sampled peaks, flipped."""
    bnd = [-1, 0, 1, k - 1, k, 32769, m - 1, m, width, width + 17]
    lengths = torch.tensor([bnd[(r + 1) % 10] for r in range(rows)], dtype=torch.int32)
    if kind == "descending":
        row = torch.arange(width, dtype=torch.float32).flip(0)
    else:
        row = torch.zeros(width)
        s = torch.arange(4096)
        row[(s // 32) * (width // 128) + s % 32] = 1 + s.float() / 4096
        row = row.flip(0)
    x = row.repeat(rows, 1)
    x[torch.arange(width)[None, :] >= lengths[:, None].clamp(min=0)] = float("nan")
    return x, lengths


@pytest.mark.parametrize("kind", ["descending", "peaks"])
@pytest.mark.parametrize("k,width,m", [(512, 98304 + 3, 98304), (1024, 65536 + 3, 65536), (2048, 65536 + 3, 65536)])
def test_batch_whose_first_cta_gate_is_highest(kind, k, width, m):
    """Regression (48418ae: 7 and 24 of 65 rows wrong): 65 rows make 2-CTA clusters whose spans take
    the one-read path; CTA 0's gate is the highest, and the check `every gate <= t` took the
    last CTA's gate for the highest (CuTe DSL's max() of a constant Uint32 compares signed)."""
    x, lengths = vllm_batch(kind, k, width, m)
    assert cluster_size(65, width) == 2 and width // 2 > topk.ONE_READ_FROM
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_blocks_k1_keeps_only_the_newest(block_size):
    """Regression (48418ae: block 0 on every row, and out-of-bounds writes under memcheck): k = 1
    leaves no block to select (k_sel = 0) besides the pinned newest one."""
    gen = torch.Generator().manual_seed(block_size)
    ends = torch.randint(1, 20001, (64,), generator=gen, dtype=torch.int32)
    ends[:3] = torch.tensor([0, 1, block_size + 1])
    width = int(ends.max())
    x = torch.randn(64, width, generator=gen)
    x[torch.arange(width)[None, :] >= ends[:, None]] = float("-inf")
    got = run_blocks(x, ends, block_size, 1)
    assert torch.equal(got, oracle.candidate_blocks(x, ends, block_size, 1))
    assert torch.equal(got[:, 0], torch.where(ends > 0, (ends + block_size - 1) // block_size - 1, -1).int())


def settling_rows(case: str, lengths: torch.Tensor, width: int, ranks: int, seed: int, k: int = 2048
                  ) -> torch.Tensor:
    """Rows for the tie path's shortcuts (t taken from the keys' bounds, no further pass) and
    their near misses. one_value / signed_zeros: one key value (a single-valued row); one_above /
    one_below: one value but a key one ulp off, somewhere in the row (same first two digits:
    must not settle); zeros_few_positives: the threshold's bucket holds only 0.0 (settles after
    the second digit); zeros_denormal_in_copy: the same, but the first CTA's span is below zero
    save one denormal (its bucket fits its copy, which keeps no bounds: must not settle);
    two_adjacent: keys one ulp apart throughout; narrow: 1 + 1e-6 randn (the gate's refinement);
    zeros_denormals: zeros, few positives and, in half the row, denormals (in zero's first-digit
    bin but above it: those CTAs hold keys > t that the copy of the keys above the bucket lacks);
    zeros_highs_first / zeros_highs_last: zeros and k - 100 positives scattered over the first /
    last CTA's span (that CTA's copy of the keys above the bucket near full)."""
    gen = torch.Generator().manual_seed(seed)
    rows = lengths.numel()
    if case in ("one_value", "one_above", "one_below"):
        x = torch.full((rows, width), 0.5)
        off = {"one_above": 1.0, "one_below": 0.0}.get(case)
        if off is not None:
            for r in range(rows):
                at = int(torch.randint(0, max(int(lengths[r]), 1), (1,), generator=gen))
                x[r, at] = torch.nextafter(torch.tensor(0.5), torch.tensor(off))
        return x
    if case == "signed_zeros":
        return torch.where(torch.rand(rows, width, generator=gen) < 0.5, -0.0, 0.0)
    if case in ("zeros_few_positives", "zeros_denormal_in_copy"):
        x = torch.relu(torch.randn(rows, width, generator=gen) - 3.2)
        if case == "zeros_denormal_in_copy":
            for r in range(rows):
                span = max((int(lengths[r]) + ranks - 1) // ranks, 1)
                x[r, :span] = -1.0
                x[r, span // 2] = 1e-45
        return x
    if case == "zeros_denormals":
        x = torch.relu(torch.randn(rows, width, generator=gen) - 3.2)
        tiny = torch.rand(rows, width, generator=gen) < 0.002
        tiny[:, : width // 2] = False
        return torch.where(tiny & (x == 0), 1e-40, x)
    if case in ("zeros_highs_first", "zeros_highs_last"):
        x = torch.zeros(rows, width)
        for r in range(rows):
            n = min(int(lengths[r]), width)
            span = max((n + ranks - 1) // ranks, 1)
            lo = 0 if case == "zeros_highs_first" else max(n - span, 0)
            hi = min(lo + span, n)
            if hi > lo:
                at = lo + torch.randperm(hi - lo, generator=gen)[: max(k - 100, 0)]
                x[r, at] = torch.rand(at.numel(), generator=gen) + 0.5
        return x
    if case == "two_adjacent":
        one = torch.tensor(1.0)
        return torch.where(torch.rand(rows, width, generator=gen) < 0.5, one, torch.nextafter(one, torch.tensor(2.0)))
    if case == "narrow":
        return 1 + 1e-6 * torch.randn(rows, width, generator=gen)
    raise ValueError(case)


SETTLING = ["one_value", "signed_zeros", "one_above", "one_below", "zeros_few_positives",
            "zeros_denormal_in_copy", "two_adjacent", "narrow", "zeros_denormals", "zeros_highs_first",
            "zeros_highs_last"]


@pytest.mark.parametrize("width", WIDTHS + [1 << 19])
@pytest.mark.parametrize("case", SETTLING)
def test_tie_path_shortcuts(width, case):
    k = 2048
    lengths = torch.tensor(span_edges(width, k), dtype=torch.int32)
    ranks = cluster_size(lengths.numel(), width)
    x = settling_rows(case, lengths, width, ranks, seed=width % 89, k=k)
    assert torch.equal(run_tokens(x, lengths, k, ROWS), oracle.topk_tokens(x, lengths, k))
    bf = x.to(torch.bfloat16)
    assert torch.equal(run_tokens(bf, lengths, k, ROWS), oracle.topk_tokens(bf.float(), lengths, k))


@pytest.mark.parametrize("width", [300000, 1 << 19])
@pytest.mark.parametrize("case", ["zeros_highs_first", "zeros_highs_last", "zeros_denormals"])
def test_tie_path_copy_at_capacity(width, case):
    """k = 4096, the copy's capacity: a CTA whose span holds k - 100 keys above the tied bucket
    writes them from its copy, beside the ties it takes."""
    k = 4096
    lengths = torch.tensor([width, width - 1, width // 2 + 5, 5 * topk.TILE * 8 + 3, k + 1, width], dtype=torch.int32)
    ranks = cluster_size(lengths.numel(), width)
    x = settling_rows(case, lengths, width, ranks, seed=width % 97, k=k)
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x, lengths, k))
    bf = x.to(torch.bfloat16)
    assert torch.equal(run_tokens(bf, lengths, k), oracle.topk_tokens(bf.float(), lengths, k))


def spiked(x: torch.Tensor, ranks: int, count: int = 300) -> torch.Tensor:
    """``x`` with ``count`` keys in [10, 11) at the start of every CTA's span and one at the
    first column of each chunk of the second attempt's sample (fewer than k in all): tile 0 and
    the sample then both guess a gate among them, far above t, so both attempts of the one-read
    path copy too few keys and fail."""
    span = x.shape[1] // ranks
    for r in range(ranks):
        x[:, r * span:r * span + count] = 10 + torch.rand(x.shape[0], count, generator=torch.Generator().manual_seed(r))
    cols = sample_chunks(x.shape[1], ranks, x.dtype, first_only=True)
    x[:, cols] = 10 + torch.rand(x.shape[0], cols.numel(), generator=torch.Generator().manual_seed(ranks))
    assert ranks * count + cols.numel() < 2048
    return x


def test_tie_path_shortcuts_taken():
    """The profiled build's marks at 64 x 128K (2 CTAs a row, spans of the one-read path).
    One-read path: rows of one value, zeros with scattered positives (ReLU) and 1 + 1e-6 randn
    rows are answered from the copies (no first-digit pass; the keys equal to the gate are
    counted, not copied), and the CTA that takes no ties writes from its copy alone (its output
    phase is a fraction of the gated pass). Where the one-read path fails (a first tile and a
    sample of large keys, ``spiked``): rows of one value are settled after their second digit (the phase
    after the second digit's pass is a fraction of that pass: no third pass over the row), and ReLU
    rows write their positives from the copy made in the second digit's pass (no output pass).
    Shortcuts that silently stopped would fail here."""
    rows, width, k = 64, 128 << 10, 2048
    ranks = cluster_size(rows, width)
    assert ranks == 2 and width // ranks > topk.ONE_READ_FROM
    gen = torch.Generator().manual_seed(3)
    group = rows // 5
    equal, relu, narrow, equal_spiked, relu_spiked = (slice(g * group, (g + 1) * group) for g in range(5))
    x = torch.full((rows, width), 0.5)
    x[relu] = torch.relu(torch.randn(group, width, generator=gen) - 3)
    x[narrow] = 1 + 1e-6 * torch.randn(group, width, generator=gen)
    x[equal_spiked] = spiked(x[equal_spiked].clone(), ranks)
    x[relu_spiked] = spiked(torch.relu(torch.randn(group, width, generator=gen) - 3), ranks)
    lengths = torch.full((rows,), width, dtype=torch.int32)
    out = poisoned((rows, k + 1 + ranks * topk.PROFILE_SLOTS), torch.int32, "cuda")
    n = lengths.cuda()
    none = torch.empty(0, 0, device="cuda")
    topk.compiled(torch.float32, False, ranks, profile=True)(x.cuda(), n, n, 0, width, 1, k, out, out, out, 0, none, 0)
    ends = out[:, k + 1:].reshape(rows, ranks, topk.PROFILE_SLOTS)[..., :len(topk.PHASES)].cpu().long()
    at = {name: ends[..., topk.PHASES.index(name)] for name in topk.PHASES}
    for one_read in (equal, relu, narrow):
        assert (at["digits from the copies"][one_read] > 0).all(), at["digits from the copies"][one_read]
        assert not (at["first-digit pass"][one_read] > 0).any()
    for one_read in (equal, relu):  # the first CTA's lowest ids fill the take of ties
        output = at["output"][one_read, 1] - at["offsets"][one_read, 1]
        assert (output * 3 < at["gated pass + index order"][one_read, 1]).all(), output
    second = at["copy pass"][equal_spiked] - at["digit 0"][equal_spiked]
    rest = at["digits 1-2"][equal_spiked] - at["copy pass"][equal_spiked]
    assert (at["first-digit pass"][equal_spiked] > 0).all() and (rest * 2 < second).all(), (second, rest)
    second = at["copy pass"][relu_spiked, 1] - at["digit 0"][relu_spiked, 1]
    output = at["output"][relu_spiked, 1] - at["offsets"][relu_spiked, 1]
    assert (at["first-digit pass"][relu_spiked] > 0).all() and (output * 3 < second).all(), (second, output)
    assert torch.equal(out[:, :k].cpu(), oracle.topk_tokens(x, lengths, k))


@pytest.mark.parametrize("k", [1, 100, 2048, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_ties_at_the_gate(k, dtype):
    """The one-read path counts the keys equal to its gate instead of copying them, and the CTAs
    whose gate is t stream their span for the ties they take. Rows where the gate is t in some
    CTAs and not in others: a constant per CTA span (rising, falling, repeating), constant spans
    between random ones, 4 distinct values, ReLU zeros with signed zeros, one value with a key
    one ulp above it at the end of the row, and spans of one value whose tile 0 holds the top."""
    width = 1 << 19
    rows = 8
    ranks = cluster_size(rows, width)
    assert ranks == 8 and width // ranks > topk.ONE_READ_FROM
    span = width // ranks
    gen = torch.Generator().manual_seed(k)
    x = torch.empty(rows, width)
    x[0] = torch.arange(ranks, dtype=torch.float32).repeat_interleave(span)
    x[1] = x[0].flip(0)
    x[2] = (torch.arange(ranks) % 3).float().repeat_interleave(span)
    x[3] = torch.randn(width, generator=gen)
    x[3].view(ranks, span)[1::2] = 4.0
    x[4] = torch.tensor([0.1, 0.5, 1.0, 2.0])[torch.randint(0, 4, (width,), generator=gen)]
    x[5] = torch.relu(torch.randn(width, generator=gen) - 3)
    x[5] = torch.where((x[5] == 0) & (torch.rand(width, generator=gen) < 0.5), -0.0, x[5])
    x[6] = 0.5
    x[6, -1] = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0))
    x[7] = 0.25
    x[7].view(ranks, span)[:, :topk.TILE] = 0.75
    x = x.to(dtype)
    lengths = torch.tensor([width, width, width - 3, width, width, width, width, width - span // 2], dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x.float(), lengths, k))


@pytest.mark.parametrize("k", [1, 100, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_gate_is_t_with_its_ties_copied(k, dtype):
    """A CTA whose exact gate is t but whose ties at it are few (they are copied, not counted)
    writes the whole answer from its copy: tile 0 holds r - 1 keys above a value V and 2 keys of
    V (so the gate, its rank-r key, is V), and more keys of V outside tile 0 make V the row's t.
    Found by the fuzzer (seed 27, case 64): such CTAs streamed their ties as well."""
    width = 1 << 19
    rows = 8
    ranks = cluster_size(rows, width)
    assert ranks == 8
    span, tile = width // ranks, topk.TILE
    share = -(-k * span // width)
    target = min(2 * share, topk.CAP * 3 // 4)
    r = -(-target * tile // span)  # the rank of the gate in tile 0
    above, v_rest = r - 1, 300
    assert ranks * above < k <= ranks * (above + 2 + v_rest)
    gen = torch.Generator().manual_seed(k)
    x = 1.0 + 0.1 * torch.rand(rows, ranks, span, generator=gen)
    for row in range(rows):
        for c in range(ranks):
            head = torch.randperm(tile, generator=gen)[:above + 2]
            x[row, c, head[:above]] = 1.24 + 0.001 * torch.rand(above, generator=gen)
            x[row, c, head[above:]] = 1.2
            x[row, c, tile + torch.randperm(span - tile, generator=gen)[:v_rest]] = 1.2
    x = x.reshape(rows, width).to(dtype)
    lengths = torch.full((rows,), width, dtype=torch.int32)
    assert torch.equal(run_tokens(x, lengths, k), oracle.topk_tokens(x.float(), lengths, k))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("path", ["engine", "short_row"])
def test_results_unchanged_as_a_programmatic_dependent(monkeypatch, graph, path):
    """Launched as programmatic dependents (``kernels/pdl.py``) of the kernels that write their inputs:
    the scores from a GEMM and the lengths from ``decode_row_lengths`` just before, eagerly and in a
    CUDA graph with fresh inputs each replay. The ids are the oracle's on those inputs every time (a
    read before the kernel before finished would give another answer), at one CTA a row and at
    clusters, for tokens and for blocks (the block-key pass between); with an opt-in short path
    switched on, the rows of <= 16K keys take it."""
    from graphs import capture_graph
    from torch_sparse_decode.kernels import pdl
    from torch_sparse_decode.kernels.topk import short_row

    monkeypatch.setattr(pdl, "ON", True)
    monkeypatch.setattr(short_row, "SHORT_ROWS", path == "short_row")
    gen = torch.Generator().manual_seed(5)
    weight = (torch.randn(1 << 16, 64, generator=gen) * 0.1).cuda()

    def step(query, seq_lens):
        logits = (query @ weight.t()).float()  # cuBLAS, the kernel before: [4, 64K]
        lengths = tsd.decode_row_lengths(seq_lens, 2)  # the MTP rows' lengths, a Triton kernel before
        return (logits, lengths, tsd.indexer_topk(logits, lengths, 2048),
                tsd.indexer_topk(logits[:, :6000], lengths, 512), tsd.select_candidate_blocks(logits, lengths, 64, 128))

    inputs = [(torch.randn(4, 64, generator=gen).cuda(), torch.randint(1, 1 << 16, (2,), generator=gen).int().cuda())
              for _ in range(4)]
    run = capture_graph(step, *inputs[0]) if graph else step
    for query, seq_lens in inputs:
        logits, lengths, wide, narrow, blocks = (t.clone().cpu() for t in run(query, seq_lens))
        assert torch.equal(wide, oracle.topk_tokens(logits, lengths, 2048))
        assert torch.equal(narrow, oracle.topk_tokens(logits[:, :6000], lengths.clamp(max=6000), 512))
        assert torch.equal(blocks, oracle.candidate_blocks(logits, lengths, 64, 128))
