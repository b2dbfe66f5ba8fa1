"""Demo: ``python -m torch_sparse_decode`` runs every op on an example, on the GPU when there is
one, and prints what ran where. On a GPU each op runs its CUDA kernel and is checked against
the reference (pure PyTorch, on CPU copies of the inputs); on the CPU each op runs its
reference, so there is nothing to check it against, and the demo says so."""

from __future__ import annotations

import sys
import time

import torch

from . import __version__, warmup
from ._library import unavailable_kernels
from .demo import run_examples


def main() -> int:
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    on_gpu = device.type == "cuda"
    where = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    print(f"torch_sparse_decode {__version__} on {where} (torch {torch.__version__})")
    if not on_gpu:
        print("No CUDA GPU: every op runs its reference (pure PyTorch), the CPU implementation. The CUDA "
              "kernels run on an SM90 (H100 / H200) or SM100 (B200) GPU.")
    start = time.perf_counter()
    warmup(device)
    print(f"warmup() took {time.perf_counter() - start:.1f} s")
    rows = run_examples(device, check=on_gpu, repeats=3)
    missing = unavailable_kernels()
    checked = "matches the reference" if on_gpu else ""
    print(f"{'op':<29} {'example':<24} {'ran':<16} {'ms/call':>9}  {checked}".rstrip())
    for row in rows:
        ran = "reference" if not on_gpu or any(op in missing for op in row["ops"]) else "CUDA kernel"
        verdict = ("yes" if row["ok"] else "NO") if on_gpu else ""
        print(f"{row['op']:<29} {row['shape']:<24} {ran:<16} {row['ms']:>9.3f}  {verdict}".rstrip())
    for op, why in missing.items():
        print(f"{op}: its CUDA kernel could not load ({why}); the reference served it")
    print("(eager wall-clock per call, including Python dispatch; see benchmarks/ for kernel timings)")
    return 0 if all(row["ok"] is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
