"""Compile the Triton block-key kernel of the top-k engine for SM90 at every block size class,
without a GPU. Run as a script (the test runs it in a subprocess without TRITON_INTERPRET, which
would replace the kernel by an interpreted one). Prints one line per configuration."""

import sys

import triton
from triton.backends.compiler import GPUTarget

from torch_sparse_decode.kernels import topk

SIGNATURE = dict(logits="*fp32", stride="i64", ends="*i32", width="i32", keys="*i32", keys_stride="i64",
                 BLOCK="constexpr", BLOCK_P2="constexpr", BLOCKS="constexpr")


def main() -> int:
    count = 0
    for block in (1, 3, 8, 64, 100, 256):
        block_p2 = triton.next_power_of_2(block)
        const = dict(BLOCK=block, BLOCK_P2=block_p2, BLOCKS=max(8192 // block_p2, 1))
        source = triton.compiler.ASTSource(fn=topk._block_keys, signature=SIGNATURE, constexprs=const)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        print(f"ok {const} smem={compiled.metadata.shared}", flush=True)
        count += 1
    print(f"compiled {count} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
