"""Demo: ``python -m torch_sparse_decode`` runs every op on an example (on the GPU when there is
one, else on the CPU), checks it against the reference and prints what ran where."""

from __future__ import annotations

import sys

import torch

from . import __version__, warmup
from .demo import run_examples


def main() -> int:
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch_sparse_decode {__version__} on {where} (torch {torch.__version__})")
    warmup(device)
    rows = run_examples(device, check=True, repeats=3)
    print(f"{'op':<29} {'example':<24} {'device':<6} {'ms/call':>9}  matches reference")
    for row in rows:
        verdict = "yes" if row["ok"] else "NO"
        print(f"{row['op']:<29} {row['shape']:<24} {device.type:<6} {row['ms']:>9.3f}  {verdict}")
    print("(eager wall-clock per call, including Python dispatch; see benchmarks/ for kernel timings)")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
