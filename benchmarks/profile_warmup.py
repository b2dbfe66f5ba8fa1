"""Where ``warmup()``'s time goes in a fresh process: the import, the CUDA context, then
``warmup()`` under cProfile, its costliest calls by cumulative time. Run it in a fresh process
(and with Triton's cache emptied, ``rm -rf ~/.triton/cache``, for a fresh machine's figure).

    TORCH_SPARSE_DECODE_CACHE=DIR python benchmarks/profile_warmup.py [--top N] [--results FILE]
"""

from __future__ import annotations

import time

started = time.perf_counter()

import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402

import torch  # noqa: E402

import torch_sparse_decode as tsd  # noqa: E402
from harness import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--top", type=int, default=40, help="calls to list")
    args = p.parse_args()
    imported = time.perf_counter() - started
    begin = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    context = time.perf_counter() - begin
    profile = cProfile.Profile()
    begin = time.perf_counter()
    profile.enable()
    hooks = tsd.warmup()
    torch.cuda.synchronize()
    profile.disable()
    took = time.perf_counter() - begin
    listing = io.StringIO()
    pstats.Stats(profile, stream=listing).sort_stats("cumulative").print_stats(args.top)
    text = (f"import {imported:.1f} s, CUDA context {context:.1f} s, warmup() {took:.1f} s ({hooks} hooks, "
            f"under cProfile)\n\n{listing.getvalue()}")
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n```\n" + text + "```\n")


if __name__ == "__main__":
    main()
