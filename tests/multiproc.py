"""Run a test body on every rank of a process group, one process per rank, with a time bound.

Each rank reports success in a file before the group is torn down: gloo's teardown can abort a
process after every check passed (a native ``terminate`` in its background threads), and that is
not a failure of the code under test. Any rank without its report fails the test, naming it.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, body, world_size: int, backend: str, tmp: str, args: tuple) -> None:
    torch.set_num_threads(1)
    # Loopback only: gloo otherwise picks the interface of the host name, which a sandbox may not route.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = os.path.join(tmp, "store")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        body(rank, world_size, dist.group.WORLD, *args)
        with open(os.path.join(tmp, f"rank{rank}.ok"), "w"):
            pass
        dist.barrier()
    except BaseException:
        # A peer may still be inside a collective: tearing the group down now would abort this
        # process and hide the error, so report it and leave the group to the exit.
        traceback.print_exc()
        raise
    dist.destroy_process_group()


def run_ranks(body, world_size: int, backend: str, *args, timeout_s: float = 300.0) -> None:
    """``body(rank, world_size, group, *args)`` on ``world_size`` spawned ranks; raise unless all pass."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(
            _entry, args=(body, world_size, backend, tmp, args), nprocs=world_size, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout_s
        crash: Exception | None = None
        try:
            # On a failure, ranks still inside a collective ignore SIGTERM: kill them soon after.
            while not ctx.join(timeout=1.0, grace_period=3.0) and time.monotonic() < deadline:
                pass
        except Exception as err:  # a rank raised or died; the reports below say whether it matters
            crash = err
        alive = [p for p in ctx.processes if p.is_alive()]
        for process in alive:
            process.kill()
        if alive:
            raise TimeoutError(f"{world_size} ranks ({backend}) did not finish within {timeout_s:.0f} s")
        missing = [r for r in range(world_size) if not os.path.exists(os.path.join(tmp, f"rank{r}.ok"))]
        if missing:
            raise AssertionError(f"ranks {missing} of {world_size} ({backend}) did not pass: {crash}") from crash
