"""The seeded GPU differential fuzzer (``fuzz.py``) as a test: ``--fuzz-cases`` mixed-batch cases
from ``--fuzz-seed``, every one bit for bit against the reference on the GPU. A failure names its
seed and case index; ``python tests/fuzz.py --seed S --case I`` runs it alone."""

import pytest

import fuzz

pytestmark = pytest.mark.gpu


def test_fuzz_mixed_batches(request):
    failures = fuzz.run(request.config.getoption("--fuzz-seed"), request.config.getoption("--fuzz-cases"))
    assert not failures, f"{len(failures)} fuzz cases differ from the reference:\n" + "\n".join(failures[:20])
