"""Where the short-row path's time goes (kernels/topk/short_row.py): builds of it with phases cut
out, each timed in CUDA graphs beside the whole kernel (cut builds give wrong ids: timing only).

    python benchmarks/profile_short_row.py [--quick] [--results FILE]

Cuts: no tail (all four digit rounds, no one-warp rank of the last bin), no count (the digit
rounds' atomics), no scan (the one-warp scans), one digit round, no rounds (launch, the reads of
the row and its length, and the output's ballots writing the first k ids).
"""

from __future__ import annotations

import torch

import cutlass
import cutlass.cute as cute
from harness import Table, graph_us, parser, rotation
from torch_sparse_decode.kernels.topk import short_digits, short_row

K = 2048


class NoCount(short_row.ShortRowTopk):
    @cute.jit
    def count(self, keys, run, t, p: cutlass.Constexpr[int], shift: cutlass.Constexpr[int], hist, tid):
        pass


class NoScan(short_row.ShortRowTopk):
    """The digit is always the middle bin (the scan's sums are still read: ``bin_count``); no tail."""

    def __init__(self, source):
        super().__init__(source)
        self.tail_digits = self.rounds

    @cute.jit
    def digit_round(self, keys, run, t, need, k, p: cutlass.Constexpr[int], hist, parts, info, tid):
        shift = 32 - short_digits.RADIX * (p + 1)
        self.count(keys, run, t, p, shift, hist, tid)
        cute.arch.sync_threads()
        self.sum_copies(hist, parts, tid)
        cute.arch.sync_threads()
        return t | (cutlass.Uint32(short_digits.BINS // 2) << cutlass.Uint32(shift)), need


def variant(digits: int, tail_digits: int | None = None):
    """``digits`` rounds; the tail after ``tail_digits`` of them (None: as shipped; digits: none)."""

    class Variant(short_row.ShortRowTopk):
        def __init__(self, source):
            super().__init__(source)
            self.rounds = digits
            self.tail_digits = self.tail_digits if tail_digits is None else tail_digits

    return Variant


CUTS = {"whole": short_row.ShortRowTopk, "no tail": variant(4, 4), "no count": NoCount,
        "no scan": NoScan, "one round": variant(1), "no rounds": variant(0)}


def build(cls, dtype):
    return short_row.build(cls(dtype), dtype)


def main() -> None:
    args = parser(__doc__).parse_args()
    table = Table(f"short-row path with phases cut out (us), k={K}, fp32", ["shape", "rows", *CUTS])
    kernels = {name: build(cls, torch.float32) for name, cls in CUTS.items()}
    for rows, width in [(1, 8 << 10), (8, 8 << 10)] + ([] if args.quick else [(64, 8 << 10), (8, 16 << 10)]):
        for kind in ("randn", "ties"):
            def make(seed: int):
                gen = torch.Generator(device="cuda").manual_seed(seed)
                x = (torch.randn(rows, width, device="cuda", generator=gen) if kind == "randn" else
                     torch.randint(0, 4, (rows, width), device="cuda", generator=gen).float())
                return x, torch.full((rows,), width, dtype=torch.int32, device="cuda")

            sets = rotation(make, rows * width * 4)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
            times = [graph_us(lambda i, f=f: f(sets[i % len(sets)][0], sets[i % len(sets)][1],
                                               sets[i % len(sets)][1], 0, width, 1, K, out, out, out, 0,
                                               sets[i % len(sets)][0], 0))
                     for f in kernels.values()]
            table.add(f"{rows}x{width >> 10}K", kind, *times)
    table.emit(args.results)


if __name__ == "__main__":
    main()
