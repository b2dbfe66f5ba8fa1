"""The Triton kernels of the one-round DCP merge, bit for bit against the reference and the oracle:
the key pre-pass, the B' row writer and the merge, on rows that saturate the most ranks, every
adversarial kind, shuffled slots and W = 2..16 (simulated ranks; the merge reads rescue rows
through an address table). On a CPU-only machine (CI) they run on CPU tensors under
TRITON_INTERPRET=1; on a GPU machine the same tests run the compiled kernels on CUDA tensors.
The local top-K comes from the reference here; test_dcp covers the pack through the CuTe engine."""

import os

import pytest
import torch

import oracle
from dcp_cases import canonical_rows as _canonical_rows
from dcp_cases import ascending_local_topk as _ascending_local_topk
from dcp_cases import merge_step as _merge_step
from dcp_cases import mixed, push_rows, saturating, shuffled, simulated_group
from inputs import KINDS, scores
from torch_sparse_decode import dcp

if torch.cuda.is_available():
    DEVICE = "cuda"
    pytestmark = pytest.mark.gpu
else:
    DEVICE = "cpu"
    pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
pytest.importorskip("triton", reason="triton not installed")
from torch_sparse_decode.ops.dcp import kernel as kernels  # noqa: E402  (after the importorskip)
from torch_sparse_decode.ops.dcp import step as dcp_step  # noqa: E402
from torch_sparse_decode.kernels.triton_order import ord16 as _pack_ord16  # noqa: E402
from torch_sparse_decode.dtypes import DCP_SCORES
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

POISON = 0x5A5A5A5A
NO_WAIT = 0x7FFFFFFFFFFFFFFF  # a workspace's state[3] between steps


def _rounding_edges() -> torch.Tensor:
    """fp32 values on bf16 rounding boundaries (ties to even both ways, carries into the exponent)."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0xBF808000, 0xBF818000,
                         0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x00008000, 0x80008000, 0x80007FFF,
                         0x00000001, 0x80000001, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF],
                        dtype=torch.int64)
    return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32)


def _pack(x, lengths, world_size, rank, topk):
    n = dcp.dcp_merge_local_topk(topk, world_size)
    rows = x.shape[0]
    packed = torch.full((rows, dcp.packed_row_words(n)), POISON, dtype=torch.int32, device=DEVICE)
    rescue = torch.full((rows, dcp.packed_row_words(dcp.rescue_row_slots(topk))), POISON, dtype=torch.int32,
                        device=DEVICE)
    kernels.pack_rows(_ascending_local_topk(x, lengths, topk).to(DEVICE), x.to(DEVICE), packed, rescue)
    return packed.cpu(), rescue.cpu()


def _check_pack(x, lengths, world_size, rank, topk):
    n = dcp.dcp_merge_local_topk(topk, world_size)
    packed, rescue = _pack(x, lengths, world_size, rank, topk)
    want_packed, want_rescue = dcp.pack_candidates(x, lengths, world_size, rank, topk)
    assert torch.equal(packed, _canonical_rows(want_packed, n))
    assert torch.equal(rescue, _canonical_rows(want_rescue, dcp.rescue_row_slots(topk)))
    return packed, rescue


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS + ("rounding_edges",))
@pytest.mark.parametrize("world_size,topk", [(2, 256), (3, 100), (4, 2048), (16, 64)])
def test_pack_rows_match_reference(kind, world_size, topk, dtype):
    """Every kind of row, fp32 and bf16 (ord16 recomputed from the scores, bf16 rounding on the bits)."""
    x = (_rounding_edges().repeat(4, 167) if kind == "rounding_edges" else scores(kind, (4, 3000), seed=world_size))
    n = dcp.dcp_merge_local_topk(topk, world_size)
    ends = [3000, 0, 1, n - 1, n, n + 1, topk - 1, topk, topk + 1]
    x = x[:, :3000].repeat(3, 1)[: len(ends)].to(dtype)
    lengths = torch.tensor(ends, dtype=torch.int32)
    _check_pack(x, lengths, world_size, 0, topk)


def test_pack_rows_ties_at_the_nth_key_go_to_the_lower_ids():
    x = torch.zeros(2, 500)
    x[0, ::3] = 1.0  # 167 tokens tie above the rest: N = 96 of them, the lowest ids
    x[1, 400:] = 2.0
    x[1, 7] = 2.0 + 1e-6  # same bf16 as 2.0: a tie, not above
    _check_pack(x, torch.tensor([500, 437], dtype=torch.int32), 4, 1, 256)


def test_pack_rows_largest_local_index_and_k_4096():
    length = 1 << 17
    x = torch.rand(1, length)
    x[0, -1] = 3.0
    x[0, 65536] = 2.5  # bit 16 set, low bits 0
    packed, rescue = _check_pack(x, torch.tensor([length], dtype=torch.int32), 2, 0, 4096)
    assert packed.shape[1] == dcp.packed_row_words(3072)


def _merge(gathered, rescue, topk, rank, peers=None):
    world_size, rows, _ = gathered.shape
    gathered, rescue = gathered.to(DEVICE), rescue.to(DEVICE)
    outs = [torch.full((rows, topk), -7, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    count = torch.full((rows,), -7, dtype=torch.int32, device=DEVICE)
    table = kernels.stacked_peers(rescue) if peers is None else peers
    kernels.merge_rows(gathered, table, rescue.stride(1), topk, rank, outs[0], outs[1], count)
    return outs[0].cpu(), outs[1].cpu(), count.cpu()


def _some_ranks(world_size: int) -> list[int]:
    """Every rank merges the same rows; their local ids differ. The interpreter is slow: three."""
    return sorted({0, world_size // 2, world_size - 1})


def _assert_merged(gathered, rescue, x, lengths, topk, peers=None, where=""):
    """The merge of these B' rows gives the oracle's ids on every rank checked."""
    want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, topk)
    for rank in _some_ranks(x.shape[0]):
        global_ids, local_ids, count = _merge(gathered, rescue, topk, rank, peers)
        assert torch.equal(global_ids, want_global), f"{where} rank {rank}"
        assert torch.equal(local_ids, want_local[rank]), f"{where} rank {rank}"
        assert torch.equal(count, want_count[rank]), f"{where} rank {rank}"


def _check_merge(x, lengths, topk, shuffle=False, separate=False):
    """The merge of the reference's B' rows (optionally shuffled, or in per-rank buffers)."""
    world_size = x.shape[0]
    n = dcp.dcp_merge_local_topk(topk, world_size)
    rows = [dcp.pack_candidates(x[r], lengths[r], world_size, r, topk) for r in range(world_size)]
    gathered = torch.stack([p for p, _ in rows])
    rescue = torch.stack([q for _, q in rows])
    if shuffle:  # B' allows any slot order (the reference pack writes best first, ours ascending)
        gathered = shuffled(gathered, n, 1)
        rescue = shuffled(rescue, dcp.rescue_row_slots(topk), 2)
    peers, keep = None, []
    if separate:  # each rank's rescue rows in a buffer of its own, reached through the table
        keep = [rescue[r].to(DEVICE, copy=True) for r in range(world_size)]
        peers = torch.tensor([t.data_ptr() for t in keep], dtype=torch.int64, device=DEVICE)
    _assert_merged(gathered, rescue, x, lengths, topk, peers)


def _check_own_pack_and_merge(x, lengths, topk, where=""):
    """Our B' rows (from the reference's local top-K ids), then the merge."""
    world_size = x.shape[0]
    rows = [_pack(x[r], lengths[r], world_size, r, topk) for r in range(world_size)]
    _assert_merged(torch.stack([p for p, _ in rows]), torch.stack([q for _, q in rows]), x, lengths, topk, where=where)


@pytest.mark.parametrize("world_size,topk", [(w, k) for w in (2, 3, 4, 8, 16) for k in (64, 256, 2048)] + [(2, 4096)])
def test_merge_at_max_saturation(world_size, topk):
    n = dcp.dcp_merge_local_topk(topk, world_size)
    if n == 0:
        pytest.skip("no one-round merge for this (topk, world_size)")
    x, lengths = saturating(world_size, topk, max(topk, 2 * n) + 77, seed=world_size)
    _check_merge(x, lengths, topk, separate=world_size == 4)


@pytest.mark.parametrize("seed", range(8))
def test_pack_and_merge_on_random_configurations(seed):
    """Random W, K, kinds and lengths near N and K: our own pack rows, then the merge."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        world_size = int(torch.randint(2, 17, (1,), generator=gen))
        topk = int(torch.randint(33, 4097, (1,), generator=gen))
        n = dcp.dcp_merge_local_topk(topk, world_size)
        if n:
            break
    kind = KINDS[int(torch.randint(0, len(KINDS), (1,), generator=gen))]
    length = topk + 40
    x = scores(kind, (world_size, 2, length), seed=seed)
    near = torch.tensor([0, 1, n - 1, n, n + 1, topk - 1, topk, length])
    lengths = near[torch.randint(0, len(near), (world_size, 2), generator=gen)].to(torch.int32)
    _check_own_pack_and_merge(x, lengths, topk, where=f"W={world_size} K={topk} {kind}")


def test_merge_lengths_at_every_edge():
    """Rank lengths around N (a full sent row or not) and K (enough candidates or not), W = 2."""
    topk, n = 256, dcp.dcp_merge_local_topk(256, 2)
    pairs = [(n - 1, n), (n, n), (n + 1, n + 1), (topk - 1, 1), (topk, 0), (topk + 1, topk + 1), (0, 0), (1, 0)]
    x = scores("random", (2, len(pairs), 400), seed=11)
    lengths = torch.tensor(pairs, dtype=torch.int32).t().contiguous()
    _check_merge(x, lengths, topk)


@pytest.mark.parametrize("world_size", [2, 3])
def test_merge_ids_beyond_one_bitmap_chunk(world_size):
    """Local lengths up to 2**17: global ids span several 4096-word chunks of the output bitmaps,
    with the best tokens at both ends of the rows (and rows that saturate)."""
    length = 1 << 17
    x = scores("random", (world_size, 2, length), seed=21)
    x[:, :, -300:] += 10.0
    x[:, :, :200] += 10.0
    x[:, 1, -5:] += 20.0  # a row some rank fills with its ends alone
    lengths = torch.tensor([[length, length - 1]] * world_size, dtype=torch.int32)
    _check_merge(x, lengths, 256)
    x, lengths = saturating(world_size, 256, length, seed=22)
    _check_merge(x, lengths, 256)


KIND_CASES = [(kind, 3) for kind in KINDS] + [(kind, w) for w in (2, 8)
                                              for kind in ("random", "all_equal", "nan_mixed")]


@pytest.mark.parametrize("kind,world_size", KIND_CASES)
def test_merge_kinds_and_short_rows(kind, world_size):
    x, lengths = mixed(world_size, 300, seed=world_size, kind=kind)
    _check_merge(x, lengths, 256, shuffle=kind == "random")


def test_merge_of_our_own_packed_rows():
    x, lengths = mixed(4, 5000, seed=3, kind="bf16_plateau")
    _check_own_pack_and_merge(x, lengths, 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS + ("rounding_edges",))
def test_pack_through_the_engine(kind, dtype):
    """The GPU pack: the CuTe engine keyed by bf16 ord16 (8 CTAs per row), then the B' rows."""
    world_size, topk = 2, 2048
    x = _rounding_edges().repeat(5, 3889) if kind == "rounding_edges" else scores(kind, (5, 70000), seed=7)
    x = x[:, :70000].to(dtype)
    n = dcp.dcp_merge_local_topk(topk, world_size)
    lengths = torch.tensor([70000, 65536, n, topk + 1, 0], dtype=torch.int32)
    packed = torch.full((5, dcp.packed_row_words(n)), POISON, dtype=torch.int32, device="cuda")
    rescue = torch.full((5, dcp.packed_row_words(dcp.rescue_row_slots(topk))), POISON, dtype=torch.int32,
                        device="cuda")
    kernels.dcp_pack(x.cuda(), lengths.cuda(), world_size, 1, topk, packed, rescue)
    want_packed, want_rescue = dcp.pack_candidates(x, lengths, world_size, 1, topk)
    assert torch.equal(packed.cpu(), _canonical_rows(want_packed, n))
    assert torch.equal(rescue.cpu(), _canonical_rows(want_rescue, dcp.rescue_row_slots(topk)))


def _push_all(group, x, lengths, topk):
    for rank, ws in enumerate(group):
        push_rows(ws, x[rank], lengths[rank], topk)


@pytest.mark.parametrize("dependent", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("world_size,topk", [(2, 2048), (3, 256), (4, 64)])
def test_exchange_step_over_simulated_ranks(monkeypatch, world_size, topk, dependent):
    """The symmetric-memory step (tagged push into every rank's buffer, then wait + merge + step
    advance) with W ranks in one process: every rank pushes, then every rank merges. Four steps
    walk both parities with new inputs (saturating rows, then every-kind rows of other lengths).
    ``pdl``: the pack launched as a programmatic dependent (``kernels/pdl.py``; GPU only)."""
    if dependent:
        if DEVICE == "cpu":
            pytest.skip("the CPU interpreter has no programmatic dependent launch")
        from torch_sparse_decode.kernels import pdl

        monkeypatch.setattr(pdl, "ON", True)
    n = dcp.dcp_merge_local_topk(topk, world_size)
    widest = max(topk, 2 * n, 600 - 77) + 77 + 2  # the bitmaps sized to the widest step below, not to 2**17
    group = simulated_group(world_size, topk, max_rows=4, max_local_len=widest, device=DEVICE)
    assert group[0].bitmap_words == -(-world_size * widest // 32)
    for step in range(4):
        if step % 2 == 0:
            x, lengths = saturating(world_size, topk, max(topk, 2 * n) + 77 + step, seed=step)
        else:
            x, lengths = mixed(world_size, 600, seed=step, kind=("random", "all_equal")[step // 2])
        _push_all(group, x, lengths, topk)
        want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, topk)
        for rank, ws in enumerate(group):
            got_global, got_local, got_count = _merge_step(ws, x.shape[1], topk)
            where = f"step {step} rank {rank}"
            assert torch.equal(got_global, want_global), where
            assert torch.equal(got_local, want_local[rank]), where
            assert torch.equal(got_count, want_count[rank]), where
            assert ws.state.tolist() == [step + 1, 0, 0, NO_WAIT], where  # advanced, reset, no error, no wait


def test_a_missing_peer_gives_no_ids_and_an_error():
    """Rank 1 never pushes: rank 0's rows come back empty (-1, count 0) with the error word set,
    and the step still advances. (Timeout 0 here: no wait, so the CPU interpreter needs no clock.)"""
    group = simulated_group(2, 256, max_rows=4, timeout_s=0.0, device=DEVICE)
    x, lengths = mixed(2, 600, seed=9, kind="random")
    push_rows(group[0], x[0], lengths[0], 256)
    got_global, got_local, count = _merge_step(group[0], 4, 256)
    assert bool((got_global == -1).all()) and bool((got_local == -1).all()) and bool((count == 0).all())
    assert group[0].state[:2].tolist() == [1, 0]
    assert group[0].take_error() == 1 << 1 and group[0].take_error() == 0  # rank 1 late, reported once


def _check_rows_but(row, got, want, rank):
    """Row ``row`` failed (no ids, count 0); every other row is the oracle's."""
    (g, l, c), (want_global, want_local, want_count) = got, want
    assert bool((g[row] == -1).all()) and bool((l[row] == -1).all()) and int(c[row]) == 0
    others = [r for r in range(g.shape[0]) if r != row]
    assert torch.equal(g[others], want_global[others])
    assert torch.equal(l[others], want_local[rank][others])
    assert torch.equal(c[others], want_count[rank][others])


@pytest.mark.parametrize("unit", ["first", "middle", "last plane"])
def test_a_unit_without_the_steps_tag_is_never_read(unit):
    """A unit of rank 1's pushed row 2 in rank 0's buffer is put back to a stale tag (and a word
    that would change the answer): rank 0's row 2 comes back empty with the error word set (a
    timeout of 0), its other rows and rank 1's merge stay exact. The merge polls the last plane
    unit first, then checks every unit of every row it reads."""
    topk, row = 256, 2
    group = simulated_group(2, topk, max_rows=4, timeout_s=0.0, device=DEVICE)
    x, lengths = mixed(2, 600, seed=5, kind="random")
    _push_all(group, x, lengths, topk)
    ws = group[0]
    units = ws.packed_words // 2
    j = {"first": 0, "middle": units // 2, "last plane": units - 1}[unit]
    at = 1 * ws.max_rows * ws.packed_words + row * ws.packed_words + 2 * j  # rank 1's row, parity 0
    ws.exchange[at] = 0x7FFF0000  # an ord16 above every live key, had it been read
    ws.exchange[at + 1] = 0  # the tag of no step
    want = oracle.dcp_global_topk(x, lengths, topk)
    _check_rows_but(row, _merge_step(ws, x.shape[1], topk), want, 0)
    assert ws.take_error() == 1 << 1
    got = _merge_step(group[1], x.shape[1], topk)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1][1]) and torch.equal(got[2], want[2][1])
    assert group[1].take_error() == 0


def test_a_rescue_row_without_the_steps_tag_is_never_read():
    """Rows that saturate a rank: the rescue rows' units of row 1 carry a stale tag in both ranks'
    buffers, so whichever rank row 1 rescues, its merge finds it not arrived: row 1 comes back
    empty with the error word set on both ranks, the other rows exact."""
    topk, row = 256, 1
    group = simulated_group(2, topk, max_rows=4, timeout_s=0.0, device=DEVICE)
    n = dcp.dcp_merge_local_topk(topk, 2)
    x, lengths = saturating(2, topk, 2 * n + 77, seed=3)
    _push_all(group, x, lengths, topk)
    for ws in group:
        ws.rescue[row * ws.rescue_words + 1 + 2 * 7] = 0  # slot 7's tag, parity 0
    want = oracle.dcp_global_topk(x, lengths, topk)
    for rank, ws in enumerate(group):
        _check_rows_but(row, _merge_step(ws, x.shape[1], topk), want, rank)
        assert ws.take_error() != 0


def test_a_peer_step_of_other_rows_is_told_apart():
    """Rank 0's step has 4 rows, rank 1's 3. Rank 0's rows 0-2 see rank 1's units of this step
    with another row count (bit 16 + 1), its row 3 nothing (late, bit 1); rank 1's rows see rank
    0's step of 4 rows (bit 16). Every row comes back empty: no silent merge of another step's
    rows. (Timeout 0: the row count shows without waiting.)"""
    group = simulated_group(2, 256, max_rows=4, timeout_s=0.0, device=DEVICE)
    x, lengths = mixed(2, 600, seed=9, kind="random")
    push_rows(group[0], x[0], lengths[0], 256)
    push_rows(group[1], x[1][:3], lengths[1][:3], 256)
    for ws, rows, error in ((group[0], 4, 1 << 17 | 1 << 1), (group[1], 3, 1 << 16)):
        got_global, got_local, count = _merge_step(ws, rows, 256)
        assert bool((got_global == -1).all()) and bool((got_local == -1).all()) and bool((count == 0).all())
        assert ws.take_error() == error, ws.rank
        assert ws.state[0].item() == 1


def test_a_step_after_a_failed_one_is_exact():
    """Rank 1 misses step 0 (rank 0's merge gives up), then both ranks run steps 1 and 2: exact,
    no error. A failed step does not poison the workspace."""
    group = simulated_group(2, 256, max_rows=4, timeout_s=0.0, device=DEVICE)
    x, lengths = mixed(2, 600, seed=9, kind="random")
    push_rows(group[0], x[0], lengths[0], 256)
    _merge_step(group[0], 4, 256)
    assert group[0].take_error() == 1 << 1
    group[1].state[0] = 1  # rank 1 skips step 0
    for step in (1, 2):
        x, lengths = mixed(2, 600, seed=step, kind="random")
        _push_all(group, x, lengths, 256)
        want = oracle.dcp_global_topk(x, lengths, 256)
        for rank, ws in enumerate(group):
            got = _merge_step(ws, 4, 256)
            assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2][rank]), (step, rank)
            assert ws.take_error() == 0


@pytest.mark.skipif(DEVICE != "cuda", reason="the step's clock (%globaltimer) runs on the GPU only")
def test_one_bound_holds_for_the_whole_step():
    """Rank 1 never calls: rank 0's step of 1200 rows (CTAs in several waves) gives up one bound
    after its first wait began, not a bound per CTA, wave or rank, and names rank 1."""
    import time

    rows, timeout_s = 1200, 0.3
    group = simulated_group(2, 256, max_rows=rows, timeout_s=timeout_s, device=DEVICE)
    x, lengths = scores("random", (rows, 600), seed=1), torch.full((rows,), 600, dtype=torch.int32)
    push_rows(group[0], x, lengths, 256)
    torch.cuda.synchronize()
    start = time.monotonic()
    got_global, _, count = _merge_step(group[0], rows, 256)
    elapsed = time.monotonic() - start
    assert bool((got_global == -1).all()) and bool((count == 0).all())
    assert group[0].take_error() == 1 << 1
    assert timeout_s <= elapsed < 2 * timeout_s, elapsed
    assert group[0].state[3].item() == NO_WAIT  # cleared for the next step


@pytest.mark.skipif(DEVICE != "cuda", reason="a stall needs two streams on the GPU")
@pytest.mark.parametrize("stall_s,timeout_s", [(0.05, 5.0), (0.4, 0.05)])
def test_a_stalled_rank(stall_s, timeout_s):
    """Rank 1 pushes its rows ``stall_s`` late (another stream, behind a sleep) while rank 0's merge
    waits: within the bound the answer is exact; past it rank 0 gets no ids and names rank 1,
    and rank 1, merging later, still gets the exact answer (rank 0's rows were there)."""
    topk = 256
    group = simulated_group(2, topk, max_rows=4, timeout_s=timeout_s, device=DEVICE)
    x, lengths = mixed(2, 600, seed=11, kind="random")
    want = oracle.dcp_global_topk(x, lengths, topk)
    push_rows(group[0], x[0], lengths[0], topk)
    ids = _ascending_local_topk(x[1], lengths[1], topk).to(DEVICE)
    late, waiting = torch.cuda.Stream(), torch.cuda.Stream()  # not the default stream, which waits for both
    scores_1 = x[1].to(DEVICE)
    torch.cuda.synchronize()
    with torch.cuda.stream(late):
        torch.cuda._sleep(int(stall_s * 2e9))  # ~2 GHz SM clock
        dcp_step.push_rows(group[1], ids, scores_1)
    with torch.cuda.stream(waiting):
        got = _merge_step(group[0], 4, topk)
    torch.cuda.synchronize()
    if stall_s < timeout_s:
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2][0])
        assert group[0].take_error() == 0
    else:
        assert bool((got[0] == -1).all()) and group[0].take_error() == 1 << 1
    got = _merge_step(group[1], 4, topk)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2][1]) and group[1].take_error() == 0


@pytest.mark.skipif(DEVICE != "cuda", reason="compiled Triton kernels only")
def test_the_step_pack_compiles_once_per_score_dtype():
    """A step's pack takes scores of any width and offset: after one step per dtype no other
    width (multiple of 16 or not, 1) or misaligned view compiles another variant, so
    ``init_dcp_topk_merge``'s warm steps leave nothing to compile inside a graph capture."""
    from torch_sparse_decode.ops.dcp import pack as dcp_pack

    caches = getattr(dcp_pack.pack_kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this Triton keeps its kernel cache elsewhere")
    group = simulated_group(2, 256, max_rows=4, device=DEVICE)
    device = torch.cuda.current_device()
    for dtype in DCP_SCORES:
        wide = torch.randn(4, 1000, device=DEVICE).to(dtype)
        for width, first in ((64, 0), (63, 0), (1, 0), (600, 1), (999, 1)):
            x = wide[:, first:first + width]
            ids = torch.full((4, 256), -1, dtype=torch.int32, device=DEVICE)
            ids[:, :min(width, 256)] = torch.arange(min(width, 256), dtype=torch.int32, device=DEVICE)
            dcp_step.push_rows(group[0], ids, x)
            if (width, first) == (64, 0):
                compiled = len(caches[device][0])
                assert compiled > 0  # the cache this test reads is the one the launch filled
        assert len(caches[device][0]) == compiled, dtype


@triton.jit
def _ord16_of(x, out, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + at, _pack_ord16(tl.load(x + at, mask=at < n)), mask=at < n)


def test_the_packs_ord16_is_the_librarys():
    """The Triton pack's ord16 (its own copy, on the bits) against ``order.bf16_ord16`` on every
    bf16 bit pattern and on fp32 values at and beside each bf16 rounding boundary."""
    from torch_sparse_decode import order

    every_bf16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    halves = (torch.arange(1 << 16, dtype=torch.int64) << 16)[::7]
    edges = torch.cat([halves, halves + 0x7FFF, halves + 0x8000, halves + 0x8001, halves + 0xFFFF])
    fp32 = (edges - ((edges >> 31) << 32)).to(torch.int32).view(torch.float32)
    for x in (every_bf16, fp32):
        got = torch.empty(x.numel(), dtype=torch.int32, device=DEVICE)
        _ord16_of[(triton.cdiv(x.numel(), 1024),)](x.to(DEVICE), got, x.numel(), BLOCK=1024)
        assert torch.equal(got.cpu(), order.bf16_ord16(x.float()).to(torch.int32)), x.dtype
