"""Compile every Triton top-k kernel configuration of the decode shapes for SM90, without a GPU.

Run as a script (the test runs it in a subprocess without TRITON_INTERPRET, which would replace
the kernels by interpreted ones). Prints one line per configuration."""

import inspect
import sys

import triton
from triton.backends.compiler import GPUTarget

from torch_sparse_decode.kernels import topk

TYPES = dict(src="*fp32", src_ids="*i32", src_stride="i64", lengths="*i32", ends="*i32", width="i32",
             dst_keys="*i32", dst_ids="*i32", dst_stride="i64", dst_lengths="*i32", out="*i32",
             out_stride="i64", k_sel="i32", k_out="i32")


def configs():
    for width in (32768, 1 << 17, 1 << 20):
        for k in (512, 2048, 4096):
            yield 0, 1, width, k, "*fp32"
            yield 0, 1, width, k, "*bf16"
            for block in (1, 3, 8, 64, 256):
                yield 1, block, width, k, "*fp32"


def main() -> int:
    params = list(inspect.signature(topk._select_chunk.fn).parameters)
    seen = set()
    for mode, block, width, k, dtype in configs():
        block_p2, levels = topk.levels_for(mode, width, block, k - 1 if mode == 1 else k)
        for level, (n, chunk, keep) in enumerate(levels):
            final = level == len(levels) - 1
            const = dict(MODE=mode if level == 0 else 2, BLOCK=block, BLOCK_P2=block_p2, PINNED=mode == 1,
                         C=chunk, KEEP=keep, FINAL=final, OUT_P2=max(topk._next_pow2(k), 2))
            types = dict(TYPES, src=dtype if level == 0 else "*i32")
            key = tuple(sorted(const.items())) + (types["src"],)
            if key in seen:
                continue
            seen.add(key)
            signature = {p: types.get(p, "constexpr") for p in params}
            source = triton.compiler.ASTSource(fn=topk._select_chunk, signature=signature, constexprs=const)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": topk.NUM_WARPS})
            print(f"ok {const} {types['src']} smem={compiled.metadata.shared}", flush=True)
    print(f"compiled {len(seen)} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
