"""Compile every Triton kernel for SM90 without a GPU: the top-k engine's block keys at every block
size class and logits dtype, the decode row lengths, and the DCP B' row writer (fp32 and bf16
scores) and merge (plain and symmetric-memory exchange) at the decode shapes, and each kernel
that takes the PDL switch (block keys, pack, tile routing, the split router GEMM at the decode
shapes) plain and as a programmatic dependent, which alone waits for the grid before. Run as a script
(the test runs it in a subprocess without TRITON_INTERPRET, which would replace the kernels by
interpreted ones). Prints one line per configuration.

It also checks the block keys' layout: with the row 16-byte aligned and no window, each thread
must own 16 bytes of a block's columns. A window start known only at run time hides that
alignment, and Triton then lays the columns one per thread (twice the instructions, the block
max by warp shuffles: 64 x 1M bs 64 took 133 us for the pass against 66 on the H200)."""

import re
import sys

import triton
from triton.backends.compiler import GPUTarget

from torch_sparse_decode.ops.dcp.config import dcp_merge_local_topk, rescue_row_slots
from torch_sparse_decode.ops.dcp import merge_triton as dcp_merge_triton
from torch_sparse_decode.ops.dcp import pack as dcp_pack
from torch_sparse_decode.ops.decode_row_lengths import kernel as row_lengths
from torch_sparse_decode.ops.select_candidate_blocks import kernel as blocks

TARGET = GPUTarget("cuda", 90, 32)

BLOCK_KEYS = dict(logits="*fp32", stride="i64", ends="*i32", starts="*i32", width="i32", keys="*i32",
                  keys_stride="i64", keep_all="i32", WINDOWED="constexpr", BLOCK="constexpr", BLOCK_P2="constexpr",
                  BLOCKS="constexpr", EARLY="constexpr", PDL="constexpr")
PACK_ROWS = dict(ids="*i32", ids_stride="i64", scores="*fp32", scores_stride="i64", packed="*i32", packed_stride="i64",
                 rescue="*i32", rescue_stride="i64", state="*i64", peers="*i64", rank="i32", push_offset="i64",
                 parity_packed="i64", parity_rescue="i64",
                 K="constexpr", N="constexpr", R="constexpr", SLOTS="constexpr", W="constexpr", EXCHANGE="constexpr",
                 EARLY_MERGE="constexpr", PDL="constexpr")
MERGE = dict(gathered="*i32", gathered_rank_stride="i64", gathered_row_stride="i64", peers="*i64",
             rescue_offset="i64", rescue_row_stride="i64", scratch="*i32", scratch_stride="i64", global_ids="*i32",
             local_ids="*i32", out_stride="i64", local_count="*i32", K="i32", rank="i32", state="*i64",
             parity_gathered="i64", parity_rescue="i64", timeout_ns="i64", W="constexpr", WP2="constexpr",
             N="constexpr", NP2="constexpr", R="constexpr",
             KP2="constexpr", WORDS="constexpr", EXCHANGE="constexpr")


def build(fn, signature, constexprs, aligned: tuple = (), warps: int = 8) -> None:
    """``aligned``: arguments assumed 16-byte aligned (as Triton assumes at launch for such
    pointers and strides)."""
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=TARGET, options={"num_warps": warps})
    print(f"ok {fn.__name__} {constexprs} smem={compiled.metadata.shared}", flush=True)
    return compiled


ROUTER_SPLIT = dict(hidden="*bf16", gate="*bf16", partials="*fp32", logits="*fp32", counters="*i32", tokens="i32",
                    WIDTH="constexpr", EXPERTS="constexpr", SPLIT="constexpr", K_SPLIT="constexpr",
                    BLOCK_T="constexpr", BLOCK_E="constexpr", BLOCK_K="constexpr", PDL="constexpr")


def programmatic_dependents() -> int:
    """Each Triton kernel that takes ``kernels/pdl.py``'s switch: its PTX waits for the grid before
    (griddepcontrol.wait) with PDL, and only then."""
    from torch_sparse_decode.ops.moe_gate_route import split

    builds = [
        (blocks._block_keys, BLOCK_KEYS, dict(WINDOWED=False, BLOCK=8, BLOCK_P2=8, BLOCKS=1024, EARLY=True)),
        (dcp_pack.pack_kernel, PACK_ROWS, dict(K=2048, N=1024, R=2048, W=2, SLOTS=2048, EXCHANGE=True,
                                              EARLY_MERGE=True)),
    ]
    for tokens, experts in ((1, 896), (64, 896), (1, 256), (64, 256)):
        plan = split.plan(tokens, experts, 7168)
        builds.append((split._router_split, ROUTER_SPLIT, dict(WIDTH=7168, EXPERTS=experts, SPLIT=plan.split,
                                                               K_SPLIT=plan.k_split, BLOCK_T=plan.block_t,
                                                               BLOCK_E=plan.block_e, BLOCK_K=split.BLOCK_K)))
    for fn, signature, constexprs in builds:
        for pdl in (False, True):
            waits = "griddepcontrol.wait" in build(fn, signature, dict(constexprs, PDL=pdl)).asm["ptx"]
            if waits != pdl:
                raise SystemExit(f"{fn.__name__} PDL={pdl}: griddepcontrol.wait {'missing' if pdl else 'present'}")
    return 2 * len(builds)


def main() -> int:
    count = 0
    for block in (1, 3, 8, 64, 100, 256):
        block_p2 = triton.next_power_of_2(block)
        for logits in ("*fp32", "*bf16", "*fp16"):
            for windowed in (False, True):
                compiled = build(blocks._block_keys, dict(BLOCK_KEYS, logits=logits),
                                 dict(WINDOWED=windowed, BLOCK=block, BLOCK_P2=block_p2,
                                      BLOCKS=max(8192 // block_p2, 1), EARLY=True, PDL=False),
                                 aligned=("logits", "stride", "keys", "keys_stride"))
                count += 1
                per_thread = 16 // (4 if logits == "*fp32" else 2)
                if not windowed and block % per_thread == 0:
                    layouts = set(re.findall(r"sizePerThread = \[1, (\d+)\]", compiled.asm["ttgir"]))
                    if layouts != {str(per_thread)}:
                        print(f"block keys {logits} BLOCK={block}: columns a thread {layouts}, want {per_thread}")
                        return 1
    for k, world_size in ((2048, 2), (2048, 16), (512, 4), (4096, 2)):
        n, slots = dcp_merge_local_topk(k, world_size), rescue_row_slots(k)
        for exchange in (False, True):
            scores = "*bf16" if exchange else "*fp32"
            build(dcp_pack.pack_kernel, dict(PACK_ROWS, scores=scores), dict(K=k, N=n, R=slots, W=world_size,
                                                                        SLOTS=max(triton.next_power_of_2(slots), 32),
                                                                        EXCHANGE=exchange, EARLY_MERGE=exchange,
                                                                        PDL=False))
            build(dcp_merge_triton.merge_kernel, MERGE, dict(W=world_size, WP2=triton.next_power_of_2(world_size), N=n,
                                              NP2=triton.next_power_of_2(n), R=slots,
                                              KP2=triton.next_power_of_2(k), WORDS=world_size << 12,
                                              EXCHANGE=exchange))
            count += 2
    build(row_lengths._row_lengths, dict(seq_lens="*i32", out="*i32", rows="i32", next_n="i32", ROWS="constexpr"),
          dict(ROWS=row_lengths.ROWS))
    count += 1
    count += programmatic_dependents()
    print(f"compiled {count} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
