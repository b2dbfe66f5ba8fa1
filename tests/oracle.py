"""Independent brute-force oracles: stable sorts over canonical scores, written without the
package's key helpers (``order.py``), so a bug there cannot hide in both sides of a test."""

from __future__ import annotations

import math

import torch


def canon(x: torch.Tensor) -> torch.Tensor:
    """fp32; NaN -> -inf, -0.0 -> +0.0 (by a different route than order.canonical)."""
    x = x.float()
    x = torch.nan_to_num(x, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    return torch.where(x == 0, torch.zeros_like(x), x)


def ranked(values: torch.Tensor) -> torch.Tensor:
    """Indices of a 1-D tensor in the library order: stable descending sort keeps lower ids first."""
    return torch.sort(canon(values), descending=True, stable=True).indices


def python_ranked(values: list[float]) -> list[int]:
    """Pure-Python ranking, used to cross-check ``ranked`` on small rows."""

    def key(i):
        v = values[i]
        v = -math.inf if math.isnan(v) else v + 0.0
        return (-v, i)

    return sorted(range(len(values)), key=key)


def pad(ids: list[int], k: int) -> list[int]:
    return sorted(ids) + [-1] * (k - len(ids))


def topk_tokens(scores: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    rows, width = scores.shape
    out = []
    for row in range(rows):
        n = min(max(int(lengths[row]), 0), width)
        best = ranked(scores[row, :n])[:k].tolist()
        out.append(pad(best, k))
    return torch.tensor(out, dtype=torch.int32).view(rows, k)


def candidate_blocks(logits: torch.Tensor, lengths: torch.Tensor, block_size: int, k: int) -> torch.Tensor:
    rows, width = logits.shape
    out = []
    for row in range(rows):
        end = min(max(int(lengths[row]), 0), width)
        blocks = -(-end // block_size)
        if blocks == 0:
            out.append([-1] * k)
            continue
        values = canon(logits[row, :end]).view(1, 1, end)
        maxima = torch.nn.functional.max_pool1d(values, block_size, block_size, ceil_mode=True).view(-1)
        assert maxima.numel() == blocks
        others = ranked(maxima[: blocks - 1])[: k - 1].tolist()
        out.append(pad(others + [blocks - 1], k))
    return torch.tensor(out, dtype=torch.int32).view(rows, k)


def kept_groups(key: torch.Tensor, num_expert_group: int, topk_group: int) -> list[int]:
    """The ``topk_group`` best groups of one token's canonical keys, by the sum of each group's two
    best keys (Python floats summed in fp32), ties to the lower group."""
    size = key.numel() // num_expert_group
    sums = []
    for g in range(num_expert_group):
        best = sorted(key[g * size:(g + 1) * size].tolist(), reverse=True)[:2]
        total = torch.tensor(best, dtype=torch.float32).sum().item() if len(best) == 2 else best[0]
        sums.append(total)
    return python_ranked(sums)[:topk_group]


def moe_route(scores, bias, topk, renormalize=True, scale=1.0, apply_sigmoid=False, num_expert_group=1,
              topk_group=1):
    """(weights f64 [T, topk], ids int32 [T, topk], condition f64 [T]) computed token by token.

    Weights are computed in float64 from the fp32 scores (the exact value the op rounds);
    ``condition`` is sum|w| / |sum w| of each renormalized row (1 otherwise): how much the
    renormalizing sum can amplify rounding. Grouped routing ranks only the kept groups' experts."""
    scores = scores.float()
    scores = torch.sigmoid(scores) if apply_sigmoid else scores
    bias = bias.float()
    size = scores.shape[1] // num_expert_group
    weights, ids, condition = [], [], []
    for row in scores:
        key = row + bias
        bad = torch.isnan(row) | torch.isnan(key)
        key = canon(torch.where(bad, float("-inf"), key))
        if num_expert_group > 1:
            members = torch.cat([torch.arange(g * size, (g + 1) * size)
                                 for g in sorted(kept_groups(key, num_expert_group, topk_group))])
            chosen = members[ranked(key[members])][:topk]
        else:
            chosen = ranked(key)[:topk]
        w = torch.where(bad, 0.0, row)[chosen].double()
        cond = 1.0
        if renormalize and bool((w == math.inf).any()):
            w = (w == math.inf).double() / int((w == math.inf).sum())  # +inf scores share the weight
        elif renormalize:
            total = w.sum()
            w = w / (total if total > 0 else 1.0)
            if total > 0 and torch.isfinite(total):
                cond = (w.abs().sum() / w.sum()).item()
        weights.append(w * scale)
        ids.append(chosen.to(torch.int32))
        condition.append(cond)
    if not weights:
        empty = torch.empty(0, topk, dtype=torch.float64)
        return empty, torch.empty(0, topk, dtype=torch.int32), torch.ones(0)
    return torch.stack(weights), torch.stack(ids), torch.tensor(condition, dtype=torch.float64)


def assert_weights_close(got: torch.Tensor, want: torch.Tensor, condition: torch.Tensor, topk: int) -> None:
    """fp32 weights against float64 ones within the rounding any summation order may give.

    Each weight is s_i * scale / S with S a sum of ``topk`` fp32 terms: any order of that sum is
    within (topk - 1) eps * sum|s| of the exact one, and the division, scale and stores add a few
    more roundings, so |got - want| <= (topk + 3) * eps * condition * |want|."""
    eps = torch.finfo(torch.float32).eps
    got = got.double()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN weights differ"
    assert torch.equal(got[~finite & ~torch.isnan(want)], want[~finite & ~torch.isnan(want)]), "inf weights differ"
    bound = (topk + 3) * eps * condition[:, None] * want.abs() + 1e-37
    err = (got - want).abs()
    worst = (err / bound)[finite].max() if finite.any() else 0.0
    assert bool((err[finite] <= bound[finite]).all()), f"weights off by up to {worst:.2f}x the bound"


def dcp_global_topk(scores: torch.Tensor, lengths: torch.Tensor, topk: int):
    """Global top-K of a W-rank group on bf16-rounded scores, ties to the lower global id.

    Returns (global_ids [T, K], local_ids [W, T, K], local_count [W, T])."""
    world_size, rows, length = scores.shape
    global_rows, local_rows, counts = [], [[] for _ in range(world_size)], [[] for _ in range(world_size)]
    for row in range(rows):
        ids, vals = [], []
        for rank in range(world_size):
            n = min(max(int(lengths[rank, row]), 0), length)
            rounded = canon(scores[rank, row, :n].to(torch.bfloat16)).to(torch.bfloat16).float()
            vals.append(rounded)
            ids.append(torch.arange(n) * world_size + rank)
        gid = torch.cat(ids)
        val = torch.cat(vals)
        by_id = torch.argsort(gid)
        gid, val = gid[by_id], val[by_id]
        best = gid[ranked(val)[:topk]].tolist()
        global_rows.append(pad(best, topk))
        for rank in range(world_size):
            mine = [g // world_size for g in best if g % world_size == rank]
            local_rows[rank].append(pad(mine, topk))
            counts[rank].append(len(mine))
    return (
        torch.tensor(global_rows, dtype=torch.int32).view(rows, topk),
        torch.tensor(local_rows, dtype=torch.int32).view(world_size, rows, topk),
        torch.tensor(counts, dtype=torch.int32).view(world_size, rows),
    )


def windowed(select, scores: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, *args) -> torch.Tensor:
    """``select`` (topk_tokens or candidate_blocks) run on each row's window [start, end) as a
    row of its own (start clamped to [0, end], end to [0, width]), so the ids count from the start."""
    width = scores.shape[1]
    rows = []
    for row in range(scores.shape[0]):
        end = min(max(int(ends[row]), 0), width)
        start = min(max(int(starts[row]), 0), end)
        piece = scores[row:row + 1, start:end]
        rows.append(select(piece, torch.tensor([end - start], dtype=torch.int32), *args))
    return torch.cat(rows)


def accumulation_bound(hidden: torch.Tensor, gate: torch.Tensor):
    """(bound on |fp32 sum - exact|, sum |h_i w_i|) of each router logit ``hidden @ gate.T``,
    while no partial sum overflows. The bf16 products are exact in fp32 (8 + 8 significant bits),
    so only the H - 1 additions round: at most (H - 1) * u * sum |h_i w_i| in any order
    (first order in u), with u = 2**-23, the unit of a truncating accumulator (a tensor core's may
    truncate; round to nearest halves it). The fp64 reference adds H * 2**-53 of the same sum."""
    width = hidden.shape[1]
    magnitude = hidden.double().abs() @ gate.double().abs().T
    return magnitude * ((width - 1) * 2.0 ** -23 * 1.01 + width * 2.0 ** -53), magnitude
