"""DCP inputs: random rows, cross-rank ties, NaN/inf, short rows, and rows built so that the
maximum number of ranks, max_saturated_ranks(K, N), saturate."""

from __future__ import annotations

import torch

from inputs import scores
from torch_sparse_decode.ops.dcp import reference
from torch_sparse_decode.dcp import dcp_merge_local_topk, max_saturated_ranks, pack_candidates


def saturating(world_size: int, topk: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows where max_saturated_ranks(K, N) ranks hold every token of the global top-K.

    Row 0: the hot ranks' scores sit far above everyone else's.
    Row 1: only the hot ranks have tokens, so the sent union is short of K (every full rank saturates).
    Row 2: the hot ranks tie on one value above everyone, so ties decide across ranks.
    """
    n = dcp_merge_local_topk(topk, world_size)
    hot = max_saturated_ranks(topk, n)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(world_size, 3, length, generator=gen)
    lengths = torch.full((world_size, 3), length, dtype=torch.int32)
    x[:hot, 0] += 10.0
    lengths[hot:, 1] = 0
    x[:hot, 2] = 5.0
    return x, lengths


def mixed(world_size: int, length: int, seed: int, kind: str = "random") -> tuple[torch.Tensor, torch.Tensor]:
    x = scores(kind, (world_size, 4, length), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(0, length + 1, (world_size, 4), generator=gen, dtype=torch.int32)
    lengths[:, 0] = length
    lengths[0, 1] = 0
    return x, lengths


def count_saturated(world_size, topk, scores_, lengths) -> torch.Tensor:
    """Saturated ranks per row as the one-round merge finds them (to assert the cases cover them)."""
    packed = [pack_candidates(scores_[r], lengths[r], world_size, r, topk)[0] for r in range(world_size)]
    return reference.saturated_ranks(torch.stack(packed), topk)[1].sum(dim=0)


def reorder_slots(rows: torch.Tensor, slots: int, order: torch.Tensor) -> torch.Tensor:
    """The same B' rows with new slot j holding old slot ``order[..., j]`` (broadcast over rows)."""
    ord16, local, live = reference.decode_b_prime(rows, slots)
    order = order.to(local.device).expand_as(local)  # a CPU permutation may reorder CUDA rows
    flat = [t.gather(-1, order).reshape(-1, slots) for t in (ord16, local, live)]
    return reference._encode_b_prime(*flat, slots).view(rows.shape)


def canonical_rows(rows: torch.Tensor, slots: int) -> torch.Tensor:
    """The same B' rows with live slots in ascending local id, then empty slots (our kernels' order;
    the layout allows any)."""
    _, local, live = reference.decode_b_prime(rows, slots)
    return reorder_slots(rows, slots, torch.sort(torch.where(live, local, 1 << 40), dim=-1).indices)


def shuffled(rows: torch.Tensor, slots: int, seed: int) -> torch.Tensor:
    """The same B' rows with their slots permuted (the layout allows any order)."""
    return reorder_slots(rows, slots, torch.randperm(slots, generator=torch.Generator().manual_seed(seed)))


def one_rank_group():
    """A one-rank process group (gloo for CPU tensors, NCCL for CUDA) for the full-step op."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


# ------------------------------------------------------------- simulated ranks of one step


def ascending_local_topk(x: torch.Tensor, lengths: torch.Tensor, topk: int) -> torch.Tensor:
    """The engine's output on the GPU: the local top-K ids ascending, -1 padded."""
    _, local, live = reference._local_topk(x, lengths, topk)
    none = torch.iinfo(torch.int64).max
    ids = torch.where(live, local, none).sort(dim=1).values
    return torch.where(ids == none, -1, ids).to(torch.int32)


def simulated_group(world_size: int, topk: int, max_rows: int, device, timeout_s: float = 5.0,
                    max_local_len: int = 1 << 17) -> list:
    """W ranks' one-round workspaces in one process: each rank's buffer a plain tensor, reached
    by address."""
    from torch_sparse_decode.ops.dcp import step as kernels

    n = dcp_merge_local_topk(topk, world_size)
    words = kernels.Workspace.words(world_size, topk, n, max_rows)
    buffers = [torch.zeros(words, dtype=torch.int32, device=device) for _ in range(world_size)]
    addresses = [b.data_ptr() for b in buffers]
    return [kernels.Workspace("simulated", buffers[r], addresses, world_size, r, topk, n, max_rows, timeout_s,
                              max_local_len=max_local_len) for r in range(world_size)]


def push_rows(ws, x: torch.Tensor, lengths: torch.Tensor, topk: int) -> None:
    """Rank ``ws.rank``'s step rows of scores ``x`` [T, L] pushed into every rank's buffer."""
    from torch_sparse_decode.ops.dcp import step as kernels

    device = ws.buffer.device
    kernels.push_rows(ws, ascending_local_topk(x, lengths, topk).to(device), x.to(device))


def merge_step(ws, rows: int, topk: int):
    """One rank's merge of a step into poisoned outputs: (global ids, local ids, counts) on the CPU."""
    from torch_sparse_decode.ops.dcp import step as kernels

    device = ws.buffer.device
    outs = [torch.full((rows, topk), -7, dtype=torch.int32, device=device) for _ in range(2)]
    count = torch.full((rows,), -7, dtype=torch.int32, device=device)
    kernels.merge_step(ws, outs[0], outs[1], count)
    return outs[0].cpu(), outs[1].cpu(), count.cpu()
