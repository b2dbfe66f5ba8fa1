"""The one-CTA short-row select (kernels/topk/short_row.py), on by default
(TORCH_SPARSE_DECODE_SHORT_ROWS=0 turns it off): which batches take it and that it compiles and
fits (CPU); on the GPU, exact against the oracle at every boundary of k, of a thread's run of
keys and of the switch, in every score dtype, windowed, in a CUDA graph, the same ids as the
engine on the same rows, and for every other user of the engine (block keys with the pinned
block, the fused outputs, the DCP pack's ord16 keys: ``select_checks``)."""

import os

import pytest
import torch

import oracle
import select_checks
import torch_sparse_decode as tsd
from inputs import KINDS, poisoned, scores
from test_indexer_topk import window_edges
from test_kernels_compile import SM90_SM_SMEM, SM90_SMEM, compiled_smem_bytes
from torch_sparse_decode.dtypes import DCP_SCORES, TOPK_SCORES
from torch_sparse_decode.kernels.topk import launch, short_row

SHORT_MAX, THREADS = short_row.SHORT_MAX, short_row.THREADS


@pytest.fixture(params=[(False, False, False), (True, False, False), (True, True, False), (True, True, True)],
                ids=["plain", "lean", "trim", "cluster"])
def short_rows(monkeypatch, request):
    """This path on (the default, unless TORCH_SPARSE_DECODE_SHORT_ROWS=0), in its plain builds, its
    lean ones (``short_row.LEAN``), its trimmed lean ones (``short_row.TRIM``) and, with those, a
    row over a cluster of CTAs where the batch's rows are few (``short_row.CLUSTER``: the default)."""
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    monkeypatch.setattr(short_row, "LEAN", request.param[0])
    monkeypatch.setattr(short_row, "TRIM", request.param[1])
    monkeypatch.setattr(short_row, "CLUSTER", request.param[2])


@pytest.mark.parametrize("source", [torch.float32, torch.int32])
@pytest.mark.parametrize("threads", [short_row.THREADS, short_row.HALF])
def test_compiles_and_fits_sm90(source, threads):
    """The widest builds (fused: the staged ids) fit a CTA; two HALF CTAs fit one SM (their point:
    one's barriers under the other's work)."""
    used = compiled_smem_bytes(short_row.compiled, source, False, threads, False, True)
    assert used <= SM90_SMEM
    if threads == short_row.HALF:
        assert 2 * (used + 1024) <= SM90_SM_SMEM  # the driver reserves 1 KiB a CTA


def test_half_width_ctas_where_the_keys_fit(monkeypatch):
    """Key columns that fit HALF threads: HALF, at any number of rows; wider: THREADS."""
    half, full = short_row.HALF, short_row.THREADS
    monkeypatch.setattr(short_row, "CLUSTER", False)  # one CTA a row, whatever the rows
    assert short_row.threads_for(half * short_row.PER) == half
    assert short_row.threads_for(half * short_row.PER + 1) == full
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    configs = []
    monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: configs.append(config))
    for rows, width in ((1, half * short_row.PER), (500, half * short_row.PER), (1, half * short_row.PER + 1)):
        launch.select(torch.zeros(rows, width), torch.zeros(rows, dtype=torch.int32), width, 1, 4,
                      torch.empty(rows, 4, dtype=torch.int32), pinned=False)
    assert [c[2] for c in configs] == [half, half, full]  # (source, pdl, threads, ord16, fused, lean, trim)


def test_on_by_default_and_off_not_built(monkeypatch):
    from torch_sparse_decode.kernels import pdl

    assert short_row.SHORT_ROWS == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_ROWS") != "0")
    monkeypatch.setattr(short_row, "SHORT_ROWS", False)
    assert short_row.catalog(None) == []
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    built = short_row.catalog(None)
    widths = (short_row.THREADS, short_row.HALF)
    topk, dcp = pdl.enabled(pdl.TOPK), pdl.enabled(pdl.DCP)
    for source in (*TOPK_SCORES, torch.int32):  # scores and block keys, fused or not; the DCP pack's ord16 keys
        assert {(source, topk, w, False, f, short_row.lean_for(w), short_row.trim_for(w)) for w in widths
                for f in (False, True)} <= set(built)
    assert {(source, dcp, w, True, False, short_row.lean_for(w), short_row.trim_for(w)) for source in DCP_SCORES
            for w in widths} <= set(built)
    one_cta = [c for c in built if len(c) == 7]  # (clustered builds: test_clusters_opt_in_and_built_as_asked)
    assert len(built) == len(set(built)) and len(one_cta) == 2 * (2 * 4 + 2)


def test_lean_builds_by_default_and_built_as_asked(monkeypatch):
    """The lean builds (one-barrier rounds, the ties-taken write) are on for CTAs of 512 threads
    unless TORCH_SPARSE_DECODE_SHORT_LEAN=0; the catalog and the launch follow ``lean_for``."""
    assert short_row.LEAN == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_LEAN", "1") == "1")
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    monkeypatch.setattr(short_row, "CLUSTER", False)
    for lean in (False, True):
        monkeypatch.setattr(short_row, "LEAN", lean)
        assert {(config[2], config[5]) for config in short_row.catalog(None)} == \
            {(short_row.HALF, lean), (short_row.THREADS, False)}
        configs = []
        monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: configs.append(config))
        for width in (100, short_row.SHORT_MAX):  # a 512-thread CTA, then a 1024-thread one
            launch.select(torch.zeros(1, width), torch.zeros(1, dtype=torch.int32), width, 1, 4,
                          torch.empty(1, 4, dtype=torch.int32), pinned=False)
        assert [(config[2], config[5]) for config in configs] == [(short_row.HALF, lean), (short_row.THREADS, False)]


def test_trimmed_builds_opt_in_and_built_as_asked(monkeypatch):
    """The trimmed lean builds are on unless TORCH_SPARSE_DECODE_SHORT_TRIM=0, and only where the
    lean builds are: the catalog and the launch follow ``trim_for``."""
    assert short_row.TRIM == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_TRIM", "1") == "1")
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    monkeypatch.setattr(short_row, "CLUSTER", False)
    for lean, trim in ((True, False), (True, True), (False, True)):
        monkeypatch.setattr(short_row, "LEAN", lean)
        monkeypatch.setattr(short_row, "TRIM", trim)
        assert {(config[2], config[6]) for config in short_row.catalog(None)} == \
            {(short_row.HALF, lean and trim), (short_row.THREADS, False)}
        configs = []
        monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: configs.append(config))
        for width in (100, short_row.SHORT_MAX):
            launch.select(torch.zeros(1, width), torch.zeros(1, dtype=torch.int32), width, 1, 4,
                          torch.empty(1, 4, dtype=torch.int32), pinned=False)
        assert [(config[2], config[6]) for config in configs] == \
            [(short_row.HALF, lean and trim), (short_row.THREADS, False)]


def test_clusters_opt_in_and_built_as_asked(monkeypatch):
    """Clusters are on unless TORCH_SPARSE_DECODE_SHORT_CLUSTER=0, and only with the trimmed
    builds, for ids alone; a batch takes the largest cluster whose CTAs all fit the
    SMs, its width's threads // CTAs threads each."""
    assert short_row.CLUSTER == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_CLUSTER", "1") == "1")
    for name, value in (("SHORT_ROWS", True), ("LEAN", True), ("TRIM", True), ("CLUSTER", True), ("WIDE", False)):
        monkeypatch.setattr(short_row, name, value)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    clustered = [c for c in short_row.catalog(None) if len(c) > 7]
    assert {(c[2], c[7]) for c in clustered} == {(threads // n, n) for n in short_row.CLUSTER_SIZES
                                                 for threads in (short_row.HALF, short_row.THREADS)}
    assert not any(c[4] for c in clustered) and len(clustered) == 2 * 2 * (4 + 2)  # scores, block keys, ord16
    configs = []
    monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: configs.append(config))
    for rows, width, fused in ((33, 8192, False), (34, 8192, False), (67, 8192, False), (8, 8193, False),
                               (8, 100, True)):
        launch.select(torch.zeros(rows, width), torch.zeros(rows, dtype=torch.int32), width, 1, 4,
                      torch.empty(rows, 4, dtype=torch.int32), pinned=False,
                      raw=torch.empty(rows, 4, dtype=torch.int32) if fused else None)
    assert [(c[2], c[7] if len(c) > 7 else 1) for c in configs] == \
        [(128, 4), (256, 2), (short_row.HALF, 1), (256, 4), (short_row.HALF, 1)]
    monkeypatch.setattr(short_row, "TRIM", False)
    assert not short_row.clusters_for(False) and all(len(c) == 7 for c in short_row.catalog(None))


def test_wide_rows_on_and_built_as_asked(monkeypatch):
    """Wide rows are on unless TORCH_SPARSE_DECODE_SHORT_WIDE=0, and only with the clusters, for
    ids alone: a batch takes the first of WIDE_BUILDS that holds its rows and whose clusters all
    fit the SMs (rows of 32K key columns: 8 CTAs of 256 threads, or 4 of 512, or 2 of 1024 where
    PAIRS; 64K: 8 of 512; 128K: 8 of 1024); more rows, wider ones, and the fused outputs past
    SHORT_MAX take the engine."""
    assert short_row.WIDE == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_WIDE", "1") != "0")
    assert short_row.PAIRS == (os.environ.get("TORCH_SPARSE_DECODE_SHORT_PAIRS", "1") != "0")  # on by default
    for name, value in (("SHORT_ROWS", True), ("LEAN", True), ("TRIM", True), ("CLUSTER", True), ("WIDE", True),
                        ("PAIRS", True)):
        monkeypatch.setattr(short_row, name, value)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    wide = [c for c in short_row.catalog(None) if len(c) > 7 and (c[7], c[2]) in short_row.WIDE_BUILDS]
    assert {(c[7], c[2]) for c in wide} == set(short_row.WIDE_BUILDS)
    assert len(wide) == 5 * (4 + len(DCP_SCORES)) and not any(c[4] for c in wide)  # scores, block keys, ord16
    assert short_row.WIDE_MAX == 8 * short_row.THREADS * short_row.PER == 8 * SHORT_MAX
    taken = []
    monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: taken.append(config))
    monkeypatch.setattr(launch, "compiled", lambda *args, **kw: lambda *a: taken.append("engine"))
    cases = {(1, SHORT_MAX + 1): (256, 8), (16, 2 * SHORT_MAX): (256, 8), (17, 2 * SHORT_MAX): (512, 4),
             (33, 2 * SHORT_MAX): (512, 4), (34, 2 * SHORT_MAX): (1024, 2), (66, 2 * SHORT_MAX): (1024, 2),
             (67, 2 * SHORT_MAX): "engine", (1, 2 * SHORT_MAX + 1): (512, 8), (33, 2 * SHORT_MAX + 1): "engine",
             (16, 4 * SHORT_MAX): (512, 8), (17, 4 * SHORT_MAX): "engine", (1, 4 * SHORT_MAX + 1): (1024, 8),
             (16, 8 * SHORT_MAX): (1024, 8), (17, 8 * SHORT_MAX): "engine", (1, 8 * SHORT_MAX + 1): "engine"}
    for rows, width in cases:
        launch.select(torch.zeros(rows, width), torch.zeros(rows, dtype=torch.int32), width, 1, 4,
                      torch.empty(rows, 4, dtype=torch.int32), pinned=False)
    assert [c if c == "engine" else (c[2], c[7]) for c in taken] == list(cases.values())
    batch = routed(taken)
    assert batch(SHORT_MAX + 1, raw=torch.empty(2, 4, dtype=torch.int32)) == "engine"
    assert batch(SHORT_MAX + 1, torch.bfloat16, ord16=True) != "engine"
    launch.select(torch.zeros(2, 4 * SHORT_MAX, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                  32 * SHORT_MAX, 8, 4, torch.empty(2, 5, dtype=torch.int32), pinned=True)
    assert taken[-1] != "engine"
    monkeypatch.setattr(short_row, "PAIRS", False)  # without them, 34-66 rows of 32K take the engine
    assert short_row.PAIR not in {(c[7], c[2]) for c in short_row.catalog(None) if len(c) > 7}
    for rows, path in ((33, (512, 4)), (34, "engine")):
        taken.clear()
        launch.select(torch.zeros(rows, 2 * SHORT_MAX), torch.zeros(rows, dtype=torch.int32), 2 * SHORT_MAX, 1, 4,
                      torch.empty(rows, 4, dtype=torch.int32), pinned=False)
        assert [c if c == "engine" else (c[2], c[7]) for c in taken] == [path]
    monkeypatch.setattr(short_row, "CLUSTER", False)
    assert short_row.widest(False) == SHORT_MAX and batch(SHORT_MAX + 1) == "engine"


@pytest.mark.parametrize("source,ord16", [(torch.float32, False), (torch.bfloat16, True), (torch.int32, False)])
@pytest.mark.parametrize("ctas", short_row.CLUSTER_SIZES)
@pytest.mark.parametrize("threads", [short_row.THREADS, short_row.HALF])
def test_cluster_builds_compile_and_fit_sm90(source, ord16, ctas, threads):
    used = compiled_smem_bytes(short_row.compiled, source, False, threads // ctas, ord16, False, True, True, ctas)
    assert used <= SM90_SMEM


@pytest.mark.parametrize("source,ord16", [(torch.float32, False), (torch.bfloat16, True), (torch.int32, False)])
@pytest.mark.parametrize("ctas,threads", short_row.WIDE_BUILDS)
def test_wide_builds_compile_and_fit_sm90(source, ord16, ctas, threads):
    used = compiled_smem_bytes(short_row.compiled, source, False, threads, ord16, False, True, True, ctas)
    assert used <= SM90_SMEM
    if threads == short_row.HALF:  # two an SM
        assert 2 * (used + 1024) <= SM90_SM_SMEM


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("threads", [short_row.THREADS, short_row.HALF])
@pytest.mark.parametrize("trim", [False, True], ids=["lean", "trim"])
def test_lean_builds_compile_and_fit_sm90(source, threads, trim):
    used = compiled_smem_bytes(short_row.compiled, source, False, threads, False, True, True, trim)
    assert used <= SM90_SMEM
    if threads == short_row.HALF:
        assert 2 * (used + 1024) <= SM90_SM_SMEM


def routed(taken: list):
    """``batch(width, dtype, **kw)``: where ``launch.select`` sends a 2-row batch of ids alone (the
    first path recorded in ``taken``)."""

    def batch(width, dtype=torch.float32, **kw):
        taken.clear()
        x = torch.zeros(2, width, dtype=dtype)
        launch.select(x, torch.zeros(2, dtype=torch.int32), width, 1, 4, torch.empty(2, 4, dtype=torch.int32),
                      pinned=False, **kw)
        return taken[0]

    return batch


def assert_takes_score_rows(batch, path: str, widest: int, fused: bool = False, ord16: bool = False) -> None:
    """An opt-in short path's batches: score rows of every dtype up to ``widest`` columns, windowed
    or not; one column more stays on the engine, and so do raw ids or a page table unless the
    path writes the ``fused`` outputs, and ord16 keys unless it ranks by them (``ord16``)."""
    for dtype in TOPK_SCORES:
        assert batch(widest, dtype) == path and batch(1, dtype) == path
        assert batch(widest, dtype, starts=torch.zeros(2, dtype=torch.int32)) == path
    assert batch(widest + 1) == "engine"
    assert batch(100, ord16=True) == (path if ord16 else "engine")
    with_fused = path if fused else "engine"
    assert batch(100, raw=torch.empty(2, 4, dtype=torch.int32)) == with_fused
    assert batch(100, table=torch.zeros(2, 1, dtype=torch.int32), page=128) == with_fused


def test_which_batches_take_it(monkeypatch):
    """Rows of at most SHORT_MAX scores or block keys, with or without the fused outputs, and the
    DCP pack's ord16 keys; wider batches take the engine (wide rows off: their own test)."""
    taken = []
    monkeypatch.setattr(short_row, "compiled", lambda *config: lambda *args: taken.append("short"))
    monkeypatch.setattr(launch, "compiled", lambda *args, **kw: lambda *a: taken.append("engine"))
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(short_row, "WIDE", False)
    batch = routed(taken)
    monkeypatch.setattr(short_row, "SHORT_ROWS", False)
    assert batch(SHORT_MAX) == "engine"  # not opted into
    monkeypatch.setattr(short_row, "SHORT_ROWS", True)
    assert_takes_score_rows(batch, "short", SHORT_MAX, fused=True, ord16=True)
    assert batch(100, torch.float16, ord16=True) == "engine"  # ord16 keys of the DCP pack's scores only
    for blocks, path in ((SHORT_MAX, "short"), (SHORT_MAX + 1, "engine")):  # block keys, the newest block pinned
        launch.select(torch.zeros(2, blocks, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 8 * blocks, 8, 4,
                      torch.empty(2, 5, dtype=torch.int32), pinned=True)
        assert taken[-1] == path


def edge_lengths(k: int, width: int) -> torch.Tensor:
    """k's edges, the runs' (n = threads * m +- 1: runs of m and m + 1 keys, at either CTA width),
    and the width's."""
    values = [-3, 0, 1, k - 1, k, k + 1, k + 2, width - 1, width, width + 9]
    for threads in (short_row.THREADS, short_row.HALF):
        for m in (1, 2, 8, 15, 16):
            values += [threads * m - 1, threads * m, threads * m + 1]
    return torch.tensor(sorted({min(max(v, -3), width + 9) for v in values}), dtype=torch.int32)


def assert_oracle_tokens(out, x, lengths, k, starts=None) -> None:
    """``out`` holds the oracle's ids of ``x``'s rows (their windows [starts, lengths) where given)."""
    if starts is None:
        want = oracle.topk_tokens(x.float(), lengths, k)
    else:
        want = oracle.windowed(oracle.topk_tokens, x.float(), starts, lengths, k)
    assert torch.equal(out.cpu(), want)


def check(x, lengths, k, starts=None):
    out = poisoned((x.shape[0], k), torch.int32, "cuda")
    tsd.indexer_topk(x.cuda(), lengths.cuda(), k, out=out, row_starts=None if starts is None else starts.cuda())
    assert_oracle_tokens(out, x, lengths, k, starts)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,width", [(1, 300), (7, 4097), (64, SHORT_MAX), (2048, 8192), (2048, SHORT_MAX),
                                     (4096, SHORT_MAX - 1)])
def test_every_kind_and_boundary(short_rows, kind, k, width):
    lengths = edge_lengths(k, width)
    check(scores(kind, (lengths.numel(), width), seed=k), lengths, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "relu_zeros", "all_equal", "tiny_negative", "nan_mixed",
                                  "inf_mixed", "signed_zeros"])
def test_half_precision(short_rows, dtype, kind):
    """bf16 / fp16 keys take two / three digits; the bits below follow from t's sign."""
    lengths = edge_lengths(512, SHORT_MAX)
    check(scores(kind, (lengths.numel(), SHORT_MAX), seed=5).to(dtype), lengths, 512)


def settling_rows(dtype: torch.dtype, width: int = 8192, k: int = 2048) -> torch.Tensor:
    """Rows whose k-th largest lies in [1, 1 + 2**-7) (keys sharing their top 16 bits): bins of m
    keys on both sides of short_row.TAIL with ties; long bins of one key, and of one key and its
    neighbour one ulp up; a long bin whose top 24 bits leave a short one. 1, half or all of the
    bin is taken; everything else is far above or below."""
    gen = torch.Generator().manual_seed(7)
    ulp = 2.0**-23

    def ints(high: int, n: int) -> torch.Tensor:
        return torch.randint(0, high, (n,), generator=gen).double()

    bins = []
    for m in (1, 2, 31, short_row.TAIL - 1, short_row.TAIL, short_row.TAIL + 1, 3 * short_row.TAIL):
        bins.append(1 + ints(8, m) * 2.0**-10 + (ints(4, m) * 2.0**-20 if dtype == torch.float32 else 0))
    for m in (short_row.TAIL + 1, 3 * short_row.TAIL):
        bins.append(torch.ones(m, dtype=torch.float64))
    bins.append(torch.cat([torch.ones(short_row.TAIL), torch.tensor([1 + ulp])]))
    bins.append(torch.cat([1 + ulp * ints(200, 90), 1 + 2.0**-15 + ints(1000, 100) * 2.0**-18]))  # 90 past 3 digits
    rows = []
    for bin_ in bins:
        m = bin_.numel()
        for taken in sorted({1, (m + 1) // 2, m}):
            row = torch.cat([100 + torch.rand(k - taken, generator=gen, dtype=torch.float64), bin_,
                             -1 - torch.rand(width - k + taken - m, generator=gen, dtype=torch.float64)])
            rows.append(row[torch.randperm(width, generator=gen)])
    return torch.stack(rows).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_settling_early(short_rows, dtype):
    """From two digits on, a short bin is ranked by one warp and a bin of one key is t; other bins
    take the rounds."""
    x = settling_rows(dtype)
    check(x, torch.full((x.shape[0],), x.shape[1], dtype=torch.int32), 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed"])
@pytest.mark.parametrize("k", [1, 64, 2048])
def test_windows(short_rows, kind, k):
    starts, ends = window_edges(k, SHORT_MAX - 50)
    width = SHORT_MAX
    x = scores(kind, (starts.numel(), width), seed=k)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    check(x, ends, k, starts)


@pytest.mark.gpu
def test_the_same_ids_as_the_engine(short_rows):
    """The rows of a batch one column too wide for the path (the engine) give the same ids."""
    lengths = edge_lengths(2048, SHORT_MAX).clamp(max=SHORT_MAX)
    x = scores("few_distinct", (lengths.numel(), SHORT_MAX), seed=3)
    short = check(x, lengths, 2048)
    wide = torch.cat([x, torch.full((x.shape[0], 1), float("inf"))], dim=1)  # never read: past every length
    engine = check(wide, lengths, 2048)
    assert torch.equal(short, engine)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TOPK_SCORES)
def test_half_width_ctas(short_rows, dtype):
    """A batch of more rows than SMs in HALF-thread CTAs (two an SM): every kind, k's and the runs' edges."""
    rows = launch.sm_count(torch.device("cuda")) + 5
    width = short_row.HALF * short_row.PER
    lengths = edge_lengths(2048, width)
    lengths = lengths.repeat(-(-rows // lengths.numel()))[:rows]
    each = -(-rows // len(KINDS))
    x = torch.cat([scores(kind, (each, width), seed=i) for i, kind in enumerate(KINDS)])[:rows]
    assert short_row.threads_for(width) == short_row.HALF
    check(x.to(dtype), lengths, 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed", "all_nan", "signed_zeros"])
@pytest.mark.parametrize("block,k", [(8, 2048), (8, 1), (64, 256), (1, 512), (3, 100)])
def test_block_keys_with_the_pinned_block(short_rows, kind, block, k):
    """select_candidate_blocks: the block-key pass, then this path; the newest block after the
    best k - 1 of the others; rows at k's edges (kept without a read) and the width's."""
    width = min(SHORT_MAX * block, 1 << 17) - 5
    keys = -(-width // block)
    lengths = torch.tensor(sorted({min(max(v * block, 0), width) for v in
                                   (0, 1, 2, k - 1, k, k + 1, k + 2, keys // 2, keys - 1, keys)} | {width - 3}),
                           dtype=torch.int32)
    select_checks.check_blocks(scores(kind, (lengths.numel(), width), seed=block + k), lengths, block, k)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed", "inf_mixed", "tiny_negative"])
@pytest.mark.parametrize("block,k", [(1, 6), (3, 6), (8, 2), (8, 3), (64, 6), (64, 17)])
def test_block_keys_in_tiny_rows(short_rows, kind, block, k):
    """Rows of a few blocks (one warp's lanes hold them all, one key a thread), k just under them,
    lengths past the width and negative: select_candidate_blocks' own edge cases, on this path."""
    width = (k + 3) * block + block // 2 + 1  # a partial last block
    ends = [-1, 0, 1, block - 1, block, block + 1, (k - 1) * block, k * block - 1, k * block, k * block + 1,
            (k + 1) * block, width, width + 9]
    lengths = torch.tensor([max(-1, min(e, width + 9)) for e in ends], dtype=torch.int32)
    select_checks.check_blocks(scores(kind, (lengths.numel(), width), seed=block + k), lengths, block, k)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 64, 2048])
def test_block_keys_in_windows(short_rows, k):
    width = 8 * SHORT_MAX - 40
    starts, ends = window_edges(k * 8, width)
    x = scores("few_distinct", (starts.numel(), width), seed=k)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    select_checks.check_blocks(x, ends, 8, k, starts)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TOPK_SCORES)
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed", "signed_zeros"])
@pytest.mark.parametrize("page,raw,values", [(64, True, True), (1, False, True), (0, False, True), (16, True, False)])
def test_fused_outputs(short_rows, dtype, kind, page, raw, values):
    """indexer_topk_fused: slots through the page table, raw ids and the values (the scores' own
    bits: NaN, -0.0), with -1, -1 and -inf padding; rows of at most k keys read for their values."""
    lengths = edge_lengths(300, 4000)
    x = scores(kind, (lengths.numel(), 4000), seed=7).to(dtype)
    select_checks.check_fused(x, lengths, 300, page, raw, values)


@pytest.mark.gpu
def test_fused_outputs_in_windows(short_rows):
    starts, ends = window_edges(64, 6000)
    select_checks.check_fused(scores("few_distinct", (starts.numel(), 6000), seed=2), ends, 64, 32, True, True,
                              starts)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 100, 2048])
def test_fused_block_table(short_rows, k):
    select_checks.check_fused_block_table(k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DCP_SCORES)
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "nan_mixed", "signed_zeros", "inf_mixed"])
@pytest.mark.parametrize("k,width", [(2048, 8192), (1024, SHORT_MAX), (64, 300)])
def test_ord16_keys(short_rows, dtype, kind, k, width):
    select_checks.check_ord16(dtype, kind, k, width)


@pytest.mark.gpu
def test_in_a_cuda_graph(short_rows):
    from graphs import capture_graph, replay_matches

    lengths = edge_lengths(2048, 8192)
    x = scores("random", (lengths.numel(), 8192), seed=1).cuda()
    graphed = capture_graph(lambda s, n: tsd.indexer_topk(s, n, 2048), x, lengths.cuda())
    fresh = [(scores(kind, tuple(x.shape), seed=9).cuda(), lengths.roll(i).cuda())
             for i, kind in enumerate(["random", "all_equal", "nan_mixed", "few_distinct"])]
    assert replay_matches(graphed, fresh, lambda s, n: oracle.topk_tokens(s.cpu(), n.cpu(), 2048)) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 33, 34])  # clusters of 4 up to 33 rows on 132 SMs, then of 2
@pytest.mark.parametrize("width", [SHORT_MAX, 8193, 8192, 8191, 4097, 300])
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed", "signed_zeros"])
def test_few_rows(short_rows, rows, width, kind):
    """Batches of few rows (a cluster a row where ``short_row.CLUSTER``): k's edges and full rows,
    in every CTA of the cluster's share."""
    lengths = torch.tensor([(width, 0, 1, 2047, 2048, 2049, width - 1, width // 2)[r % 8] for r in range(rows)],
                           dtype=torch.int32).clamp(0, width)
    x = scores(kind, (rows, width), seed=rows + width)
    for k in (1, 2048):
        check(x, lengths, k)
    starts = (lengths // 3).clamp(max=max(width - 1, 0))
    check(x, lengths, 2048, starts)


@pytest.fixture
def wide_on(monkeypatch):
    """Rows past SHORT_MAX key columns over clusters (``short_row.WIDE``, with the defaults it needs),
    where their clusters fit the SMs."""
    for name in ("SHORT_ROWS", "LEAN", "TRIM", "CLUSTER", "WIDE", "PAIRS"):
        monkeypatch.setattr(short_row, name, True)


@pytest.fixture(params=["first", "4 x 512", "2 x 1024"])
def wide_rows(wide_on, monkeypatch, request):
    """Wide rows at any number of rows (more clusters than the SMs hold wait their turn): each batch
    takes the first wide build that holds its rows, of every build or of those after the first (``4 x
    512``) or the first two (``2 x 1024``), so rows of 32K key columns take each of theirs."""
    skip = {"first": 0, "4 x 512": 1, "2 x 1024": 2}[request.param]
    ctas, threads = short_row.WIDE_BUILDS[skip]
    width = request.node.callspec.params.get("width") if hasattr(request.node, "callspec") else None
    if skip and width is not None and width > ctas * threads * short_row.PER:
        pytest.skip("wider than the build: the same as the first's")  # the first that holds it, as in "first"
    monkeypatch.setattr(short_row, "WIDE_BUILDS", short_row.WIDE_BUILDS[skip:])
    fits = short_row.wide_build
    monkeypatch.setattr(short_row, "wide_build", lambda key_cols, rows, sms: fits(key_cols, 1, sms))


def wide_lengths(k: int, width: int) -> torch.Tensor:
    """k's edges, the width's, and the runs' at each wide build's threads (n = threads * m +- 1)."""
    values = [-3, 0, 1, k - 1, k, k + 1, width - 1, width, width + 9, SHORT_MAX, SHORT_MAX + 1]
    values += [c * t * m + d for c, t in short_row.WIDE_BUILDS for m in (1, 2, 8, 15, 16) for d in (-1, 0, 1)]
    return torch.tensor(sorted({min(max(v, -3), width + 9) for v in values}), dtype=torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed", "inf_mixed", "signed_zeros",
                                  "relu_zeros"])
@pytest.mark.parametrize("k,width", [(1, SHORT_MAX + 1), (2048, 2 * SHORT_MAX - 1), (4096, 2 * SHORT_MAX),
                                     (2048, 2 * SHORT_MAX + 1), (64, 3 * SHORT_MAX), (2048, 4 * SHORT_MAX),
                                     (2048, 4 * SHORT_MAX + 1), (4096, 8 * SHORT_MAX)])
def test_wide_rows(wide_rows, kind, k, width):
    """Rows over clusters of 2, 4 and 8 CTAs: k's, the runs' and the width's edges, every kind."""
    lengths = wide_lengths(k, width)
    check(scores(kind, (lengths.numel(), width), seed=k + width), lengths, k)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [4 * SHORT_MAX, 8 * SHORT_MAX])
def test_wide_rows_of_one_value(wide_rows, width):
    """A 64K or 128K row of one value keeps its lowest k ids: 2**15 to 2**17 ties precede the last
    warps' (the counts' ties in 19 bits)."""
    lengths = torch.tensor([width, width - 1, width - 33, width // 2 + 1], dtype=torch.int32)
    for k in (1, 2048, 4096):
        check(torch.full((lengths.numel(), width), 0.5), lengths, k)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 33, 34, 66, 67, 200])
@pytest.mark.parametrize("dtype", TOPK_SCORES)
@pytest.mark.parametrize("width", [2 * SHORT_MAX - 5, 2 * SHORT_MAX + 5, 6 * SHORT_MAX + 5])
def test_wide_batches(wide_on, rows, dtype, width):
    """Batches at each build's edge of rows (the most whose clusters fit the SMs, one more), every
    dtype, windowed too."""
    lengths = wide_lengths(2048, width)
    lengths = lengths.repeat(-(-rows // lengths.numel()))[:rows]
    each = -(-rows // len(KINDS))
    x = torch.cat([scores(kind, (each, width), seed=i) for i, kind in enumerate(KINDS)])[:rows].to(dtype)
    check(x, lengths, 2048)
    check(x, lengths, 2048, (lengths // 3).clamp(min=0))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "nan_mixed"])
@pytest.mark.parametrize("width", [4 * SHORT_MAX, 8 * SHORT_MAX])
def test_wide_windows(wide_rows, kind, width):
    starts, ends = window_edges(2048, width - 50)
    x = scores(kind, (starts.numel(), width), seed=4)
    col = torch.arange(width)
    x = torch.where((col < starts[:, None]) | (col >= ends[:, None]), float("inf"), x)  # would win if read
    check(x, ends, 2048, starts)


@pytest.mark.gpu
def test_wide_rows_the_same_ids_as_the_engine(wide_rows, monkeypatch):
    lengths = wide_lengths(2048, 3 * SHORT_MAX)
    x = scores("few_distinct", (lengths.numel(), 3 * SHORT_MAX), seed=3)
    wide = check(x, lengths, 2048)
    monkeypatch.setattr(short_row, "WIDE", False)
    assert torch.equal(wide, check(x, lengths, 2048))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "all_equal", "few_distinct", "nan_mixed"])
@pytest.mark.parametrize("block,k,wide", [(8, 2048, 4), (8, 1, 4), (16, 512, 4), (8, 2048, 8)])
def test_wide_block_keys(wide_rows, kind, block, k, wide):
    """select_candidate_blocks over 16K-128K block keys: the newest block pinned after the best k - 1."""
    width = wide * SHORT_MAX * block - 3
    keys = -(-width // block)
    lengths = torch.tensor(sorted({min(v * block, width) for v in (0, k, k + 1, SHORT_MAX + 1, keys // 2 + 7, keys)}),
                           dtype=torch.int32)
    select_checks.check_blocks(scores(kind, (lengths.numel(), width), seed=block + k), lengths, block, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DCP_SCORES)
@pytest.mark.parametrize("kind", ["random", "bf16_plateau", "all_equal", "nan_mixed", "signed_zeros"])
@pytest.mark.parametrize("k,width", [(2048, 4 * SHORT_MAX), (1024, 2 * SHORT_MAX + 1), (2048, 8 * SHORT_MAX)])
def test_wide_ord16_keys(wide_rows, dtype, kind, k, width):
    """The DCP pack's local select at 32K-128K keys a rank (one cluster of 4 or 8 a row)."""
    select_checks.check_ord16(dtype, kind, k, width, wide_lengths)
