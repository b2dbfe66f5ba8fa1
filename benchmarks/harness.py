"""The one timing harness : per-call time of a CUDA graph holding 20 back-to-back
calls, median of >= 50 replays, inputs rotated over buffers larger than L2, baselines timed by the
same code in the same process, results appended as a dated table to benchmarks/history/runs.md
(benchmarks/RESULTS.md holds each op's current table)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import subprocess
import tempfile
from typing import Callable, Sequence

import torch

CALLS_PER_GRAPH = 20
REPLAYS = 50
ROTATE_BYTES = 4 * 60 * 2**20  # four times the H200's 60 MB L2
GRAPH_TIMING = f"per call in a CUDA graph of {CALLS_PER_GRAPH} calls, median of {REPLAYS} replays"
# Tables of calls on one small input set (the merge's B' rows: tens of KB, left in L2).
SAME_INPUTS = f"{GRAPH_TIMING}, the same inputs every call"
ROTATED = f"{GRAPH_TIMING}, inputs rotated over > {ROTATE_BYTES >> 20} MiB"
# Tables of 2-GPU calls timed with graph_us(align=...).
ALIGNED = ("each replay starts after a one-element all-reduce and a ~20 us device sleep, so both ranks start it "
           "together")
ALIGN_SLEEP_CYCLES = 40_000  # ~20 us at the H200's clock: both hosts have launched the replay by then


def spawn_ranks(rank_main: Callable, world_size: int, *args) -> None:
    """``rank_main(rank, world_size, store, *args)`` in one process per GPU, the process group's
    file store in a temporary folder."""
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < world_size:
        raise SystemExit(f"needs {world_size} GPUs")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(world_size, os.path.join(tmp, "store"), *args), nprocs=world_size, join=True)


def two_gpu_main(description: str, rank_main: Callable, flag: str, flag_help: str, one_gpu: Callable) -> None:
    """A 2-GPU script's command line: ``rank_main`` on two GPUs (``spawn_ranks``, with --quick
    and --results), or with ``flag`` only ``one_gpu(results, quick)`` on one."""
    cli = parser(description)
    cli.add_argument(flag, action="store_true", help=flag_help)
    args = cli.parse_args()
    if getattr(args, flag.lstrip("-").replace("-", "_")):
        one_gpu(args.results, args.quick)
    else:
        spawn_ranks(rank_main, 2, args.quick, args.results)


@contextlib.contextmanager
def switched(module, attr: str, value):
    """``module.attr`` (a path's switch: ``pdl.ON``, ``split.SPLIT``) set to ``value`` within, as it
    was after."""
    saved = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, saved)


def rotation(make_inputs: Callable[[int], Sequence[torch.Tensor]], bytes_per_set: int) -> list:
    """As many input sets (from ``make_inputs(seed)``) as it takes to exceed ROTATE_BYTES, <= 20."""
    count = max(2, min(CALLS_PER_GRAPH, -(-ROTATE_BYTES // max(bytes_per_set, 1))))
    return [make_inputs(seed) for seed in range(count)]


def graph_us(call: Callable[[int], object], *, calls: int = CALLS_PER_GRAPH, replays: int = REPLAYS,
             align: Callable[[], object] | None = None) -> float:
    """Median per-call microseconds of ``call(0) ... call(calls - 1)`` captured in one CUDA graph.

    ``call(i)`` launches the i-th call; it should pick its input set as ``i % len(sets)``.
    ``align`` (multi-GPU calls): enqueued before each replay's start event, a collective that ends
    on every rank at about the same moment, so that a rank's replay does not also time how late
    its peer's host launched the same replay (``ALIGNED``).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        if align is not None:
            align()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def rank_aligner(group) -> Callable[[], None]:
    """``graph_us``'s ``align`` for a process group: a one-element all-reduce on the current stream
    (it ends on every rank at about the same moment), then a short device sleep (so that the start
    event never waits for this rank's host to launch the replay)."""
    import torch.distributed as dist

    token = torch.zeros(1, device="cuda")

    def align() -> None:
        dist.all_reduce(token, group=group)
        torch.cuda._sleep(ALIGN_SLEEP_CYCLES)

    return align


# MEASURED.md: a 1 GiB device-to-device copy on the H200. The floor uses the larger of this and
# what this run measures, so a slow measurement never loosens a bar.
REFERENCE_COPY_TBS = 4.23


def copy_bandwidth_tbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in TB/s (bytes read + written): best of a few copies."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    del src, dst
    return 2 * nbytes / best / 1e12


def floor_bandwidth_tbs() -> tuple[float, float]:
    """(measured, used for the floor) copy bandwidth in TB/s."""
    measured = copy_bandwidth_tbs()
    return measured, max(measured, REFERENCE_COPY_TBS)


def commit() -> str:
    # The device machine's copy carries the .git of the session's start, not later commits.
    if os.environ.get("TSD_COMMIT"):
        return os.environ["TSD_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Table:
    """A benchmark table: printed for people, appended to the results file with its provenance."""

    def __init__(self, title: str, columns: Sequence[str], timing: str | None = None):
        """``timing``: how the numbers were taken, when not by ``graph_us``."""
        self.title, self.columns, self.rows = title, list(columns), []
        self.timing = timing or ROTATED

    def add(self, *values) -> None:
        self.rows.append([_fmt(v) for v in values])
        print("  " + " | ".join(self.rows[-1]), flush=True)  # progress, in case a later row fails

    def markdown(self) -> str:
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        stamp = datetime.date.today().isoformat()
        lines = [
            f"### {self.title}",
            "",
            f"{stamp}, {gpu}, torch {torch.__version__}, commit {commit()}; {self.timing}.",
            "",
            "| " + " | ".join(self.columns) + " |",
            "| " + " | ".join("---" for _ in self.columns) + " |",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def emit(self, results: str | None) -> None:
        text = self.markdown()
        print(text, flush=True)
        if results:
            with open(results, "a") as f:
                f.write("\n" + text)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def phase_marks(slots: torch.Tensor, phases: int) -> tuple[list[float], list[float]]:
    """A profiled kernel's marks, ``slots`` (..., phases + 2) on the CPU: each phase's end in SM
    cycles since its CTA began (0: not taken), then the CTA's start and end on the global timer
    (ns, low 32 bits). Returns (median cycles of each phase over the CTAs: its end less the latest
    end before it, 0 where not taken; the timeline in us: the kernel's span from the first CTA's
    start, the median CTA, the slowest CTA, the last CTA's start)."""
    slots = slots.reshape(-1, phases + 2).long()
    ends = slots[:, :phases].double()
    before = torch.cummax(torch.cat([torch.zeros(len(ends), 1, dtype=torch.double), ends[:, :-1]], -1), -1).values
    spent = torch.where(ends > 0, ends - before, torch.zeros_like(ends))
    start, end = slots[:, phases] & 0xFFFFFFFF, slots[:, phases + 1] & 0xFFFFFFFF
    first = start.min()
    start, end = (start - first) % (1 << 32), (end - first) % (1 << 32)  # the timer's low 32 bits may wrap
    cta = (end - start).double()
    timeline = [end.max().item() / 1e3, cta.median().item() / 1e3, cta.max().item() / 1e3, start.max().item() / 1e3]
    return spent.median(dim=0).values.tolist(), timeline


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "history", "runs.md"),
                   help="markdown file the tables are appended to ('' to only print)")
    p.add_argument("--quick", action="store_true", help="a subset of the shapes")
    return p
