"""Every call passes the arguments its function takes (pylint's argument checks), on the CPU.

The GPU tests skip here, so a GPU test that calls a helper with a missing or unknown argument
would first fail on a GPU machine: the whole short-row test file did (97 tests, a helper called
without its device), and CI, which has no GPU, stayed green."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# no-value-for-parameter, too-many-function-args, unexpected-keyword-arg, redundant-keyword-arg
CHECKS = "E1120,E1121,E1123,E1124"


def test_every_call_passes_the_arguments_its_function_takes():
    paths = [*sorted(str(p) for d in ("tests", "benchmarks", "examples") for p in (ROOT / d).glob("*.py")),
             str(ROOT / "torch_sparse_decode")]
    done = subprocess.run([sys.executable, "-m", "pylint", "--disable=all", f"--enable={CHECKS}",
                           "--source-roots=tests,benchmarks", "--score=n", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
