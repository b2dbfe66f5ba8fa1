"""The benchmark scripts run only on a GPU, so CI cannot time them; it can still catch a script
that no longer imports or parses its arguments (each prints its usage and exits 0)."""

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
SCRIPTS = sorted(f for f in os.listdir(BENCHMARKS) if f.endswith(".py") and f != "harness.py")


def test_every_benchmark_script_is_listed():
    assert {"bench_topk.py", "bench_dcp.py", "bench_moe_route.py", "compare_topk.py", "profile_topk.py",
            "profile_dcp.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_parses_its_arguments(script):
    done = subprocess.run([sys.executable, script, "--help"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--results" in done.stdout


def test_compare_topk_shapes_parse():
    sys.path.insert(0, BENCHMARKS)
    try:
        import compare_topk
    finally:
        sys.path.remove(BENCHMARKS)
    assert compare_topk.shape_of("blocks:64x1024:8") == ("blocks", 64, 1 << 20, 8)
    assert compare_topk.shape_of("tokens:8x128") == ("tokens", 8, 128 << 10, 1)
    with pytest.raises(ValueError, match="--shapes"):
        compare_topk.shape_of("block:8x128")


def test_the_opt_in_check_script_parses_and_names_its_steps(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "opt_in_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    done = subprocess.run(["bash", script, "nonsense"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 2 and "short warmup tests suite fuzz sanitize bench peer" in done.stderr


def test_profile_short_row_cut_builds_compile():
    """The cut builds subclass the kernel's phases, so a phase whose signature changes breaks them
    only when they compile (from fake tensors: no GPU needed)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        import profile_short_row
    finally:
        sys.path.remove(BENCHMARKS)
    import torch

    from torch_sparse_decode.kernels.topk import short_row

    for cut in profile_short_row.CUTS.values():
        short_row.build(cut(torch.float32), torch.float32)


def test_profile_short_row_check_names_a_candidate_that_differs():
    """``--check`` (run on the GPU) on stand-in kernels: the candidate that writes other ids than
    the whole kernel is named, the others pass, and rows wider than a build's CTA are skipped."""
    sys.path.insert(0, BENCHMARKS)
    try:
        import profile_short_row
    finally:
        sys.path.remove(BENCHMARKS)
    from types import SimpleNamespace

    def ids(src, lengths, starts, windowed, cols, block, k, out, *rest):
        out.copy_((src.argsort(dim=1, descending=True, stable=True)[:, :k] if k <= cols else
                   out.new_full(out.shape, -1)).int())

    def off_by_one(src, lengths, starts, windowed, cols, block, k, out, *rest):
        ids(src, lengths, starts, windowed, cols, block, k, out)
        out[:, -1] += 1

    names = ("whole", *profile_short_row.EXACT)
    made = {name: SimpleNamespace(threads=1024 if name == "whole" else 512, per=16, ctas=1) for name in names}
    kernels = {name: off_by_one if name == "512, lean" else ids for name in names}
    assert profile_short_row.check(12, made, kernels, list(profile_short_row.EXACT), device="cpu") == {"512, lean"}
    kernels["512, lean"] = ids
    assert profile_short_row.check(12, made, kernels, list(profile_short_row.EXACT), device="cpu") == set()


def test_profiled_short_row_builds_compile():
    """The phase-marked builds (``profile_short_row.py --phases``) at both CTA widths, for scores
    and for block keys (a pinned row's marks sit after its newest block)."""
    import torch

    from torch_sparse_decode.kernels.topk import short_row

    for source in (torch.float32, torch.int32):
        for threads in (short_row.HALF, short_row.THREADS):
            short_row.build(short_row.ShortRowTopk(source, threads=threads, profile=True), source)


def test_phase_marks_reads_skipped_phases_and_a_wrapped_timer():
    sys.path.insert(0, BENCHMARKS)
    try:
        import harness
    finally:
        sys.path.remove(BENCHMARKS)
    import torch

    # Two CTAs, three phases: the second skipped by the first CTA (0), and the global timer's low
    # 32 bits wrapping between the first CTA's start and the second's end.
    slots = torch.tensor([[100, 0, 400, 2**32 - 1000, 2**32 - 1000 + 3000],
                          [200, 500, 600, 2**32 - 500, 1500]])
    spent, timeline = harness.phase_marks(slots, 3)
    assert spent == [100.0, 0.0, 100.0]  # torch's lower medians of (100, 200), (0, 300), (300, 100)
    # us: the span to the first CTA's end (3000 ns), CTAs of 3000 and 2000 ns, the last start at 500
    assert timeline == [3.0, 2.0, 3.0, 0.5]
    assert harness.phase_marks(slots[:1], 3)[0] == [100.0, 0.0, 300.0]


def test_sass_count_runs_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "sass_count.py", "--quick", "--results", ""], cwd=BENCHMARKS,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| short_row")]
    assert len(rows) == 2 and all(float(row.split("|")[-2]) > 0 for row in rows), done.stdout  # plain, lean
