import pytest
import torch

import oracle
from dcp_cases import count_saturated, mixed, one_rank_group, saturating, shuffled
from inputs import DEVICES, KINDS
from torch_sparse_decode import dcp
from torch_sparse_decode.dtypes import DCP_SCORES
from torch_sparse_decode.ops.dcp import group as dcp_group
from torch_sparse_decode.ops.dcp.config import GROUPS


def test_config_helpers_match_the_seed():
    assert dcp.MAX_WORLD_SIZE == 16 and dcp.LOCAL_INDEX_BITS == 17
    n = {w: dcp.dcp_merge_local_topk(2048, w) for w in (1, 2, 3, 4, 8, 16)}
    assert n == {1: 0, 2: 1536, 3: 1056, 4: 768, 8: 384, 16: 192}
    assert dcp.dcp_merge_local_topk(64, 2) == 0  # 64 would not be smaller than topk
    assert dcp.dcp_merge_local_topk(64, 4) == 32
    assert dcp.packed_row_words(1536) == 1584 and dcp.packed_row_words(32) == 33
    assert [dcp.max_saturated_ranks(2048, n[w]) for w in (2, 3, 4, 8, 16)] == [1, 1, 2, 5, 10]
    assert dcp.dcp_topk_merge_max_rows(2048, 999) == 0
    assert not dcp.dcp_topk_merge_fits(1, 2048, 0)
    assert not dcp.dcp_topk_merge_fits(1, 2048, 999)


def test_fit_is_per_group_and_the_kernel_asks_the_same_helper(monkeypatch):
    """Two groups set up with the same (K, N) and different max_rows: each keeps its own bound,
    the group-less answer is the smallest, and the CUDA op takes the one-round step exactly when
    the public helper says its group fits and the local width is within the group's max_local_len."""
    pytest.importorskip("triton", reason="triton not installed")
    from torch_sparse_decode.ops.dcp import kernel as kernels

    class Workspace:
        def __init__(self, max_local_len):
            self.local_topk, self.max_local_len = 1536, max_local_len

    for name, rows, width in (("a", 8, 1 << 17), ("b", 32, 4096)):
        state = dcp.DcpGroup(name, 2048, 1536, rows, width, 5.0, Workspace(width))
        monkeypatch.setitem(GROUPS, (name, 2048), state)
    assert dcp.dcp_topk_merge_max_rows(2048, 1536) == 8
    assert dcp.dcp_topk_merge_max_rows(2048, 1536, "b") == 32 and dcp.dcp_topk_merge_fits(32, 2048, 1536, "b")
    assert not dcp.dcp_topk_merge_fits(9, 2048, 1536, "a") and not dcp.dcp_topk_merge_fits(9, 2048, 1536)
    assert dcp.dcp_topk_merge_max_rows(2048, 1536, "c") == 0
    assert dcp.dcp_group("b", 2048).max_rows == 32 and dcp.dcp_group("c", 2048) is None

    taken = []
    monkeypatch.setattr(kernels, "one_round_step", lambda *args: taken.append("one-round"))
    monkeypatch.setattr(kernels, "generic_step", lambda *args: taken.append("generic"))
    steps = (("a", 8, 64), ("a", 9, 64), ("a", 8, 1 << 17), ("a", 8, (1 << 17) + 1), ("b", 9, 4096), ("b", 9, 4097),
             ("c", 1, 64))
    for name, rows, width in steps:
        kernels.dcp_topk_merge(torch.zeros(rows, width), None, 2048, name, None, None, None)
    assert taken == ["one-round", "generic", "one-round", "generic", "one-round", "generic", "generic"]


def _u32(x: int) -> int:
    return x & 0xFFFFFFFF


def test_packed_row_is_the_seed_b_prime_layout_bit_for_bit():
    length = 65600
    x = torch.full((2, length), float("nan"))
    x[0, 5] = 1.0  # bf16 0x3F80 -> ord16 0xBF80
    x[0, 65540] = 2.0  # bf16 0x4000 -> ord16 0xC000; l has bit 16 set, low bits 4
    x[0, 65541] = -0.0  # ties +0.0: ord16 0x8000
    x[1, :3] = torch.tensor([-1.0, 3.0, 0.5])
    lengths = torch.tensor([length, 3], dtype=torch.int32)
    packed, rescue = dcp.pack_candidates(x, lengths, 4, 1, 64)  # N = 32 slots + 1 plane word
    assert packed.shape == (2, 33) and rescue.shape == (2, 66)
    words = [[_u32(v) for v in row] for row in packed.tolist()]
    # Row 0: three real tokens, then 29 NaN tokens (live, scoring -inf: ord16 0x007F).
    row = words[0]
    slot_of = {w: j for j, w in enumerate(row[:32])}
    assert slot_of[0xC000FFFB] is not None and (row[32] >> slot_of[0xC000FFFB]) & 1 == 1
    assert (row[32] >> slot_of[0xBF80FFFA]) & 1 == 0
    assert 0x8000FFFA in slot_of and (row[32] >> slot_of[0x8000FFFA]) & 1 == 1  # l = 65541
    assert all(w >> 16 == 0x007F for w in row[:32] if w not in (0xC000FFFB, 0xBF80FFFA, 0x8000FFFA))
    assert 0 not in row[:32]
    # Row 1: three live words, the rest empty (0), bit planes 0.
    row = words[1]
    live = sorted(w for w in row[:32] if w)
    assert live == sorted([0x407FFFFF, 0xC040FFFE, 0xBF00FFFD])  # ord16(-1.0) = ~0xBF80 & 0xFFFF
    assert row[32] == 0 and row[:32].count(0) == 29


def _one_round(x, lengths, topk, device, shuffle=False):
    x, lengths = x.to(device), lengths.to(device)
    world_size = x.shape[0]
    rows = [dcp.pack_candidates(x[r], lengths[r], world_size, r, topk) for r in range(world_size)]
    gathered, rescue = torch.stack([p for p, _ in rows]), torch.stack([q for _, q in rows])
    if shuffle:
        n = dcp.dcp_merge_local_topk(topk, world_size)
        gathered = shuffled(gathered, n, 1)
        rescue = shuffled(rescue, dcp.rescue_row_slots(topk), 2)
    return [[t.cpu() for t in dcp.merge_packed(gathered, rescue, topk, r)] for r in range(world_size)]


def _generic(x, lengths, topk, device):
    x, lengths = x.to(device), lengths.to(device)
    world_size = x.shape[0]
    keys = torch.stack([dcp.local_topk_keys(x[r], lengths[r], world_size, r, topk) for r in range(world_size)])
    return [[t.cpu() for t in dcp.merge_generic(keys, r)] for r in range(world_size)]


def check_all_paths(x, lengths, topk, device):
    want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, topk)
    for path in (_one_round(x, lengths, topk, device), _one_round(x, lengths, topk, device, shuffle=True),
                 _generic(x, lengths, topk, device)):
        for rank, (global_ids, local_ids, local_count) in enumerate(path):
            assert torch.equal(global_ids, want_global), rank
            assert torch.equal(local_ids, want_local[rank]), rank
            assert torch.equal(local_count, want_count[rank]), rank


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("topk", [64, 256, 2048])
def test_max_saturation(device, world_size, topk):
    n = dcp.dcp_merge_local_topk(topk, world_size)
    if n == 0:
        pytest.skip("no one-round merge for this (topk, world_size)")
    x, lengths = saturating(world_size, topk, max(topk, 2 * n) + 77, seed=world_size)
    saturated = count_saturated(world_size, topk, x, lengths)
    assert saturated.tolist() == [dcp.max_saturated_ranks(topk, n)] * 3
    check_all_paths(x, lengths, topk, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_kinds_and_short_rows(device, kind, world_size):
    x, lengths = mixed(world_size, 300, seed=world_size, kind=kind)
    check_all_paths(x, lengths, 256, device)


@pytest.mark.parametrize("device", DEVICES)
def test_simulate_matches_oracle(device):
    x, lengths = mixed(4, 5000, seed=3, kind="bf16_plateau")
    got, local_ids, local_count = dcp.simulate_dcp_topk(x.to(device), lengths.to(device), 2048, return_local=True)
    want_global, want_local, want_count = oracle.dcp_global_topk(x, lengths, 2048)
    assert torch.equal(got.cpu(), want_global)
    assert torch.equal(local_ids.cpu(), want_local) and torch.equal(local_count.cpu(), want_count)


def test_bf16_scores_and_largest_local_index():
    length = 1 << 17
    x = torch.rand(2, 2, length).to(torch.bfloat16)
    x[1, :, -1] = 7.0  # l = 2**17 - 1 on rank 1: all 17 bits set
    lengths = torch.full((2, 2), length, dtype=torch.int32)
    check_all_paths(x, lengths, 128, "cpu")


def test_generic_takes_local_lengths_beyond_the_packed_limit():
    x = torch.rand(2, 1, (1 << 17) + 100)
    x[1, 0, -1] = 9.0
    lengths = torch.full((2, 1), x.shape[2], dtype=torch.int32)
    global_ids = _generic(x, lengths, 64, "cpu")[0][0]
    assert torch.equal(global_ids, oracle.dcp_global_topk(x, lengths, 64)[0])
    assert ((1 << 17) + 99) * 2 + 1 in global_ids[0].tolist()
    with pytest.raises(ValueError, match="scores may have at most 131072"):
        dcp.pack_candidates(x[0], lengths[0], 2, 0, 64)


def test_the_step_check_names_the_ranks_once(monkeypatch):
    """dcp_topk_merge_check decodes the one-round error word: late ranks, ranks whose step had
    another row count; it reports an error once, and only the group's (and topk's) workspaces."""
    pytest.importorskip("triton", reason="triton not installed")

    class Workspace:
        rank, timeout_ns = 0, int(2.5e9)

        def __init__(self, error):
            self.error = error

        def take_error(self):
            error, self.error = self.error, 0
            return error

    group = one_rank_group()
    g = group.group_name
    for (name, topk), error in (((g, 2048), 1 << 3 | 1 << 5 | 1 << 17), ((g, 512), 1), ((g + "-other", 2048), 1)):
        monkeypatch.setitem(GROUPS, (name, topk), dcp.DcpGroup(name, topk, 1, 8, None, 2.5, Workspace(error)))
    with pytest.raises(dcp.DcpStepError, match=r"rank\(s\) 3, 5 did not send their rows within 2.5 s .*; "
                                               r"rank\(s\) 1 sent a step with another row count"):
        dcp.dcp_topk_merge_check(group, 2048)
    dcp.dcp_topk_merge_check(group, 2048)  # reported once
    with pytest.raises(dcp.DcpStepError, match=r"topk 512, rank 0\): rank\(s\) 0 did not send"):
        dcp.dcp_topk_merge_check(group)


def test_every_variant_a_step_takes_is_compiled_at_init(monkeypatch):
    """The engine picks its cluster size from CLUSTER_SIZES only, and warm_step compiles the ord16
    engine at each of them for both score dtypes, and the step's merge."""
    pytest.importorskip("triton", reason="triton not installed")
    from torch_sparse_decode.ops.dcp import step as kernels
    from torch_sparse_decode.kernels import topk
    from torch_sparse_decode.ops.dcp import merge as dcp_merge

    sizes = {topk.cluster_size(rows, width, sms) for rows in (1, 3, 8, 64, 600, 65535)
             for width in (1, 8192, 8193, 1 << 16, 1 << 17) for sms in (78, 132)}
    assert sizes == set(topk.CLUSTER_SIZES)
    asked = []
    monkeypatch.setattr(topk, "compiled", lambda *args, **kw: asked.append((args, kw)))
    monkeypatch.setattr(dcp_merge, "compiled", lambda *args: asked.append(args))
    kernels.warm_step(4, 2048)
    engines = {(dtype, ranks) for (dtype, pinned, ranks), kw in asked[:-1] if kw == {"ord16": True} and not pinned}
    assert engines == {(d, r) for d in DCP_SCORES for r in topk.CLUSTER_SIZES}
    assert asked[-1] == (4, 2048, True)


@pytest.mark.gpu
def test_init_builds_the_workspace_and_warms_the_step_where_every_rank_agrees(monkeypatch):
    """init's one-round branch, on a one-rank group made to look like two agreeing GPU ranks: it
    makes the group's workspace, compiles the step's variants, then runs the warm steps (one per
    score dtype) on the one-round path. (It once called the workspace maker through a module that
    did not define it, an AttributeError no single-GPU test reached.)"""
    from torch_sparse_decode.ops.dcp import group as dcp_group, step

    group = one_rank_group()
    calls = []
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dcp_group, "_local_support", lambda *args: (True, ""))
    monkeypatch.setattr(dcp_group, "_agree", lambda *args: True)
    monkeypatch.setattr(step, "make_workspace", lambda *args: calls.append(("workspace", args[1], args[3])) or "ws")
    monkeypatch.setattr(step, "warm_step", lambda *args: calls.append(("warm", *args)))
    monkeypatch.setattr(dcp_group, "_warm_step", lambda group, topk, dtype: calls.append(("step", dtype)))
    try:
        assert dcp.init_dcp_topk_merge(group, 2048, 8) == dcp.dcp_merge_local_topk(2048, 2)
        assert dcp.dcp_group(group, 2048).workspace == "ws"
    finally:
        GROUPS.pop((group.group_name, 2048), None)
    assert calls == [("workspace", 2, 2048), ("warm", 2, 2048), ("step", torch.float32), ("step", torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_pack_unchanged_as_a_programmatic_dependent(monkeypatch, graph):
    """Launched as programmatic dependents (``kernels/pdl.py``): the local select after the GEMM
    that writes the scores, the pack after the select, eagerly and in a CUDA graph with fresh
    inputs each replay. The B' rows are the reference's on those scores every time (slots in
    ascending local id, as the kernels write them)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dcp_cases import canonical_rows
    from graphs import capture_graph
    from torch_sparse_decode.kernels import pdl

    monkeypatch.setattr(pdl, "ON", True)
    world_size, topk = 2, 2048
    gen = torch.Generator().manual_seed(13)
    keys = (torch.randn(20000, 64, generator=gen) * 0.1).cuda()
    lengths = torch.tensor([20000, 7000, 1500], dtype=torch.int32).cuda()

    def step(query):
        x = (query @ keys.t()).float()  # cuBLAS, the kernel before
        return (x, *dcp.pack_candidates(x, lengths, world_size, 1, topk))

    sets = [torch.randn(3, 64, generator=gen).cuda() for _ in range(4)]
    run = capture_graph(step, sets[0]) if graph else step
    n, slots = dcp.dcp_merge_local_topk(topk, world_size), dcp.rescue_row_slots(topk)
    for query in sets * 2:
        x, packed, rescue = (t.cpu() for t in run(query))
        want_packed, want_rescue = dcp.pack_candidates(x, lengths.cpu(), world_size, 1, topk)
        assert torch.equal(canonical_rows(packed, n), canonical_rows(want_packed, n))
        assert torch.equal(canonical_rows(rescue, slots), canonical_rows(want_rescue, slots))


@pytest.mark.parametrize("device", DEVICES)
def test_dcp_zero_rows_and_zero_width(device):
    """Empty batches and rows with no local tokens: empty outputs and -1 padding, on every device."""
    world, topk = 2, 256
    ids = dcp.simulate_dcp_topk(torch.randn(world, 0, 100, device=device),
                                torch.zeros(world, 0, dtype=torch.int32, device=device), topk)
    assert ids.shape == (0, topk)
    packed, rescue = dcp.pack_candidates(torch.randn(0, 100, device=device),
                                         torch.zeros(0, dtype=torch.int32, device=device), world, 0, topk)
    global_ids, local_ids, count = dcp.merge_packed(torch.stack([packed] * 2), torch.stack([rescue] * 2), topk, 0)
    assert global_ids.shape == (0, topk) and count.shape == (0,)
    lengths = torch.full((world, 3), 5, dtype=torch.int32, device=device)
    ids = dcp.simulate_dcp_topk(torch.randn(world, 3, 0, device=device), lengths, topk)
    assert (ids == -1).all() and ids.shape == (3, topk)
    keys = dcp.local_topk_keys(torch.randn(3, 0, device=device), lengths[0], world, 0, topk)
    assert (keys == -1).all()


def test_workspace_offsets_stay_32_bit():
    """K = 4096 on 2 ranks: 50,841 rows would put rescue offsets past 2**31."""
    error = dcp_group._argument_error(4096, 50841, None, 30.0, 2)
    assert isinstance(error, ValueError) and "max_rows must be at most 50840 for topk=4096 on 2 ranks" in str(error)
    assert dcp_group._argument_error(4096, 50840, None, 30.0, 2) is None
    assert isinstance(dcp_group._argument_error("128", 8, None, 30.0, 2), TypeError)
