"""Every CUDA kernel under compute-sanitizer: memcheck, racecheck and initcheck over a case matrix.

    python tests/sanitize.py                    # all three tools; exit 1 on any error
    python tests/sanitize.py --tools memcheck   # one tool
    python tests/sanitize.py --matrix           # the matrix alone, no sanitizer (what each tool runs)
    python tests/sanitize.py --sections dcp     # a part of the matrix (topk, short, dcp, moe, front, fuzz)

The matrix runs each kernel in the configurations that take its different paths: the top-k
engine at every cluster size (1, 2, 4, 8 CTAs per row), fp32 / bf16 / block keys / ord16 keys,
the one-read path and its fallback, rows kept unread, k = 1 and 4096, unaligned and strided
views, and select_candidate_blocks with k = 1 (k_sel = 0); the Triton block-key pre-pass at
block sizes 1..256; the DCP pack (Triton) and the CuTe merge of simulated ranks (W = 2, 4, 16), and
the symmetric-memory step (push, wait, merge) over simulated ranks, a peer of other rows included;
moe_route in each flag combination, grouped and not, fp32 and bf16; then a run of fuzzer cases
(mixed batches). Every case is also checked against the reference, so a tool's slowdown cannot
hide a wrong answer.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = {  # tool -> extra flags
    "memcheck": ["--leak-check", "no"],
    "racecheck": ["--racecheck-report", "hazard"],
    "initcheck": [],
}


SECTIONS = ("topk", "short", "dcp", "moe", "front", "fuzz")


def matrix(small: bool, fuzz_cases: int, sections=SECTIONS) -> int:
    """Run the case matrix (``sections`` of it) on the GPU; returns how many cases differed from the
    reference."""
    sys.path.insert(0, HERE)
    import dcp_cases
    import fuzz
    import oracle

    import torch_sparse_decode as tsd
    from torch_sparse_decode import dcp
    from torch_sparse_decode.dtypes import TOPK_SCORES
    from torch_sparse_decode.ops.moe_route import warps

    bad = 0

    def expect(name, got, want):
        nonlocal bad
        same = torch.equal(got.cpu(), want.cpu())
        bad += not same
        print(f"  {name}: {'ok' if same else 'DIFFERS'}", flush=True)

    gen = torch.Generator().manual_seed(0)
    widths = [3000, 12000, 40000, 300001] if small else [6000, 12000, 98307, 1 << 19]
    for width in widths if "topk" in sections else ():  # cluster sizes 1, 2, 4, 8 at 6 rows
        for dtype in TOPK_SCORES:
            x = torch.randn(6, width + 1, generator=gen)[:, 1:]
            x[1] = torch.arange(width).flip(0).float()  # descending: the first CTA's gate is highest
            x[2] = 0.5  # all equal: the tie-heavy passes
            lengths = torch.tensor([width, width, width, width // 2 + 1, 0, 9000], dtype=torch.int32)
            for k in (1, 2048, 4096):
                got = tsd.indexer_topk(x.to(dtype).cuda(), lengths.cuda(), k)
                expect(f"indexer {str(dtype)[6:]} 6x{width} k={k}", got, oracle.topk_tokens(x.to(dtype).float(),
                                                                                          lengths, k))
    rows = 65 if "topk" in sections else 0
    x, lengths = torch.arange(98307).flip(0).float().repeat(rows, 1), torch.full((rows,), 32769, dtype=torch.int32)
    if rows:
        expect("indexer 65x98307 (2-CTA one-read)", tsd.indexer_topk(x.cuda(), lengths.cuda(), 512),
               oracle.topk_tokens(x, lengths, 512))
    ends = torch.randint(1, 20001, (64,), generator=gen, dtype=torch.int32)
    x = torch.randn(64, int(ends.max()), generator=gen)
    x[torch.arange(x.shape[1])[None, :] >= ends[:, None]] = float("-inf")
    for block in (1, 3, 8, 64, 256) if "topk" in sections else ():
        for k in (1, 64, 2048):
            got = tsd.select_candidate_blocks(x.cuda(), ends.cuda(), block, k)
            expect(f"blocks 64 rows bs={block} k={k}", got, oracle.candidate_blocks(x, ends, block, k))
    if "topk" in sections:  # windows [row_starts, lengths): unaligned, across CTAs, empty, past the end
        width = 120001 if small else 300001
        x = torch.randn(6, width, generator=gen)
        starts = torch.tensor([0, 1, width // 2, width - 2, width + 5, 7], dtype=torch.int32)
        ends = torch.tensor([width, width - 1, width, width, width, 9000], dtype=torch.int32)
        got = tsd.indexer_topk(x.cuda(), ends.cuda(), 2048, row_starts=starts.cuda())
        expect(f"indexer windows 6x{width} k=2048", got, oracle.windowed(oracle.topk_tokens, x, starts, ends, 2048))
        got = tsd.select_candidate_blocks(x.cuda(), ends.cuda(), 8, 2048, row_starts=starts.cuda())
        expect(f"blocks windows 6x{width} bs=8 k=2048", got,
               oracle.windowed(oracle.candidate_blocks, x, starts, ends, 8, 2048))
    if "topk" in sections:  # the fused output stage: KV slots, raw ids, values; block tables
        from torch_sparse_decode.ops.indexer_topk_fused import reference as fused
        from torch_sparse_decode.ops.select_candidate_blocks_fused import reference as blocks_fused

        width = 120001 if small else 300001
        x = torch.randn(5, width, generator=gen).to(torch.bfloat16)
        ends = torch.tensor([width, width - 7, 9000, 100, 0], dtype=torch.int32)
        starts = torch.tensor([0, 3, 8000, 200, 0], dtype=torch.int32)
        table = torch.randint(0, 1 << 20, (5, -(-width // 64) + 1), generator=gen, dtype=torch.int32)
        for windows in (None, starts):
            got = [torch.empty(5, 2048, dtype=torch.int32) for _ in range(2)] + [torch.empty(5, 2048, dtype=x.dtype)]
            want = [torch.empty_like(t) for t in got]
            cuda = [t.cuda() for t in got]
            torch.ops.sparse_decode.indexer_topk_fused(x.cuda(), ends.cuda(), 2048, *cuda, table.cuda(), 64,
                                                       None if windows is None else windows.cuda())
            fused.indexer_topk_fused(x, ends, 2048, *want, table, 64, windows)
            for name, g, w in zip(("slots", "ids", "values"), cuda, want):
                expect(f"indexer fused {name} windows={windows is not None}", g.nan_to_num(0.0), w.nan_to_num(0.0))
        blocks = torch.randint(0, 1 << 30, (5, -(-width // 8)), generator=gen, dtype=torch.int32)
        got = [torch.empty(5, 2048, dtype=torch.int32, device="cuda") for _ in range(2)]
        want = [torch.empty(5, 2048, dtype=torch.int32) for _ in range(2)]
        torch.ops.sparse_decode.select_candidate_blocks_fused(x.cuda(), ends.cuda(), 8, 2048, *got, blocks.cuda())
        blocks_fused.select_candidate_blocks_fused(x, ends, 8, 2048, *want, blocks)
        expect("blocks fused table", got[0], want[0])
        expect("blocks fused ids", got[1], want[1])
    for dtype in (torch.bfloat16, torch.float16) if "topk" in sections else ():
        for block in (1, 8, 64):
            got = tsd.select_candidate_blocks(x.to(dtype).cuda(), ends.cuda(), block, 2048)
            expect(f"blocks 64 rows {str(dtype)[6:]} bs={block} k=2048", got,
                   oracle.candidate_blocks(x.to(dtype), ends, block, 2048))
    # The short-row select (kernels/topk/short_row.py), switched on here; its wide rows unless
    # TORCH_SPARSE_DECODE_SHORT_WIDE=0.
    from torch_sparse_decode.kernels.topk import short_row

    if "short" in sections:
        saved, short_row.SHORT_ROWS = short_row.SHORT_ROWS, True
        try:
            wide = (short_row.SHORT_MAX + 1, 2 * short_row.SHORT_MAX + 1, 4 * short_row.SHORT_MAX + 1,
                    short_row.WIDE_MAX) if short_row.WIDE else ()
            for width in (1000, 8192, 8193, short_row.SHORT_MAX, *wide):  # 8192: a full HALF CTA (or cluster)
                for dtype in TOPK_SCORES:
                    x = torch.randn(6, width + 1, generator=gen)[:, 1:]  # unaligned rows
                    x[1] = torch.arange(width).flip(0).float()
                    x[2] = 0.5
                    x[3, ::3] = float("nan")
                    lengths = torch.tensor([width, width, width, width // 2 + 1, 0, 1025], dtype=torch.int32)
                    for k in (1, 2048, 4096):
                        got = tsd.indexer_topk(x.to(dtype).cuda(), lengths.cuda(), k)
                        expect(f"SHORT_ROWS {str(dtype)[6:]} 6x{width} k={k}", got,
                               oracle.topk_tokens(x.to(dtype).float(), lengths, k))
                starts = torch.tensor([0, 1, width // 2, width - 2, width + 5, 7], dtype=torch.int32)
                got = tsd.indexer_topk(x.cuda(), lengths.cuda(), 64, row_starts=starts.cuda())
                expect(f"SHORT_ROWS windows 6x{width}", got,
                       oracle.windowed(oracle.topk_tokens, x, starts, lengths, 64))
                # the fused outputs, block keys and the DCP pack's ord16 keys
                from torch_sparse_decode.kernels.topk import launch
                from torch_sparse_decode.ops.indexer_topk_fused.reference import indexer_topk_fused

                table = torch.randint(0, 1 << 16, (6, -(-width // 64)), generator=gen, dtype=torch.int32)
                got = tsd.indexer_topk_fused(x.cuda(), lengths.cuda(), 64, page_table=table.cuda(), page_size=64,
                                             ids=True, values=True)
                want = [torch.empty(6, 64, dtype=torch.int32) for _ in range(2)] + [torch.empty(6, 64)]
                indexer_topk_fused(x, lengths, 64, *want, table, 64)
                for name, g, w in zip(("slots", "ids", "values"), got, want):
                    expect(f"SHORT_ROWS fused {name} 6x{width}", g.view(torch.int32), w.view(torch.int32))
                ids = torch.empty(6, 2048, dtype=torch.int32, device="cuda")
                launch.select_ord16(x.cuda(), lengths.cuda(), 2048, ids)
                expect(f"SHORT_ROWS ord16 6x{width}", ids, dcp_cases.ascending_local_topk(x, lengths, 2048))
                blocks = tsd.select_candidate_blocks(x.cuda(), lengths.cuda(), 8, 64)
                expect(f"SHORT_ROWS blocks 6x{width} bs=8 k=64", blocks, oracle.candidate_blocks(x, lengths, 8, 64))
            # rows of 32K key columns at 17-33 rows: 4 CTAs of 512 threads a row; at 34-66, 2 of 1024 (PAIRS)
            for rows, build in ((24, "4 x 512"), (40, "2 x 1024")) if short_row.WIDE else ():
                if rows > 33 and not short_row.PAIRS:
                    continue
                x = torch.randn(rows, 2 * short_row.SHORT_MAX, generator=gen)
                x[::3] = 0.5
                lengths = torch.randint(0, 2 * short_row.SHORT_MAX + 1, (rows,), generator=gen, dtype=torch.int32)
                expect(f"SHORT_ROWS wide {build} {rows}x{x.shape[1]}", tsd.indexer_topk(x.cuda(), lengths.cuda(), 2048),
                       oracle.topk_tokens(x, lengths, 2048))
            # HALF-thread CTAs past the SMs (two an SM), and each way to settle t early
            from test_short_row import settling_rows

            rows = torch.cuda.get_device_properties(0).multi_processor_count + 2
            x = torch.randn(rows, 8192, generator=gen)
            x[::3] = 0.5
            x[1::7, ::5] = float("nan")
            lengths = torch.randint(0, 8193, (rows,), generator=gen, dtype=torch.int32)
            expect(f"SHORT_ROWS half-width CTAs {rows}x8192", tsd.indexer_topk(x.cuda(), lengths.cuda(), 2048),
                   oracle.topk_tokens(x, lengths, 2048))
            for dtype in (torch.float32, torch.float16):
                x = settling_rows(dtype)
                lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.int32)
                got = tsd.indexer_topk(x.cuda(), lengths.cuda(), 2048)
                want = oracle.topk_tokens(x.float(), lengths, 2048)
                expect(f"SHORT_ROWS settling early {str(dtype)[6:]}", got, want)
        finally:
            short_row.SHORT_ROWS = saved
    dcp_worlds = ((2, 2048, 20000 if small else 65536), (4, 512, 9000), (16, 4096, 3000))
    for world, topk, length in dcp_worlds if "dcp" in sections else ():
        x = torch.randn(world, 3, length, generator=gen).to(torch.bfloat16)
        lengths = torch.tensor([[length, length // 3, 0]] * world, dtype=torch.int32)
        want = oracle.dcp_global_topk(x.float(), lengths, topk)[0]
        expect(f"dcp pack + merge W={world} K={topk}", dcp.simulate_dcp_topk(x.cuda(), lengths.cuda(), topk), want)
    for world, topk in ((2, 2048), (4, 256)) if "dcp" in sections else ():  # the step over simulated ranks
        x, lengths = dcp_cases.saturating(world, topk, 5000, seed=world)
        group = dcp_cases.simulated_group(world, topk, max_rows=3, device="cuda", timeout_s=0.0)
        want = oracle.dcp_global_topk(x, lengths, topk)[0]
        for step in range(2):  # both parities
            for ws in group:
                dcp_cases.push_rows(ws, x[ws.rank], lengths[ws.rank], topk)
            for ws in group:
                expect(f"dcp step W={world} K={topk} parity {step} rank {ws.rank}",
                       dcp_cases.merge_step(ws, 3, topk)[0], want)
        for ws in group:  # rank 0's step has 2 rows, the others' 3
            dcp_cases.push_rows(ws, x[ws.rank, :3 - (ws.rank == 0)], lengths[ws.rank, :3 - (ws.rank == 0)], topk)
        expect(f"dcp step W={world} other rows: no ids", dcp_cases.merge_step(group[0], 2, topk)[2],
               torch.zeros(2, dtype=torch.int32))
        expect(f"dcp step W={world} other rows: error word", torch.tensor(group[0].take_error()),
               torch.tensor(sum(1 << (16 + r) for r in range(1, world))))
    moe_shapes = ((896, 16, 1, 1), (256, 8, 1, 1), (1024, 16, 1, 1), (7, 3, 1, 1), (256, 8, 8, 4), (1024, 32, 32, 8),
                  (64, 32, 32, 32), (512, 22, 1, 1), (1024, 32, 1, 1), (544, 20, 32, 2))
    for experts, topk, groups, kept in moe_shapes if "moe" in sections else ():
        for renormalize in (True, False):
            for sigmoid in (True, False):
                dtype = torch.bfloat16 if sigmoid and renormalize else torch.float32
                s = torch.randn(33, experts, generator=gen).to(dtype)
                s[0] = float("nan")
                weights, ids = tsd.moe_route(s.cuda(), torch.zeros(experts).cuda(), topk, renormalize=renormalize,
                                             apply_sigmoid=sigmoid, num_expert_group=groups, topk_group=kept)
                want_s = torch.sigmoid(s.cuda().float()).cpu() if sigmoid else s
                expect(f"moe_route {experts}/{topk} groups {groups}/{kept} renormalize={renormalize} "
                       f"sigmoid={sigmoid} {dtype}", ids,
                       oracle.moe_route(want_s, torch.zeros(experts), topk, renormalize=renormalize,
                                        num_expert_group=groups, topk_group=kept)[1])
                if warps.fits(experts, groups, topk):  # the warp kernel too, at any batch
                    warped = torch.full_like(ids, -7), torch.full_like(weights, float("nan"))
                    warps.route(s.cuda(), torch.zeros(experts).cuda(), topk, renormalize, 1.0, sigmoid, groups, kept,
                                warped[1], warped[0])
                    expect(f"moe_route warps {experts}/{topk} groups {groups}/{kept} renormalize={renormalize} "
                           f"sigmoid={sigmoid} {dtype}", warped[0], ids)
    # The router front: T = 1 .. 16 through the front kernel (past the op's switch too), the two
    # model shapes, routing checked against moe_route of the front's own logits (each case runs
    # twice: both mailbox parities). T = 17 (the GEMM path) not under racecheck: cuBLAS's
    # warp-specialized GEMM kernels report shared-memory hazards of their own.
    from torch_sparse_decode.ops.moe_gate_route import front, kernel as gate_kernel, split

    gate_kernel.FRONT_TOKENS = front.MAX_TOKENS
    gemm = () if os.environ.get("TSD_SANITIZE_TOOL") == "racecheck" else (17,)
    fronts = ((896, 7168, 16, 1, 1), (256, 7168, 8, 8, 4)) if "front" in sections else ()
    for experts, width, topk, groups, kept in fronts:
        for tokens in ((1, 9, 16) if small else (1, 2, 4, 8, 9, 16)) + gemm:
            hidden = torch.randn(tokens, width, generator=gen).bfloat16().cuda()
            gate = (torch.randn(experts, width, generator=gen) * width ** -0.5).bfloat16().cuda()
            hidden[0, 0] = float("nan")
            bias = torch.zeros(experts).cuda()
            for _ in range(2):  # both parities
                weights, ids, logits = tsd.moe_gate_route(hidden, gate, bias, topk, scale=2.5,
                                                          num_expert_group=groups, topk_group=kept)
                want = tsd.moe_route(torch.sigmoid(logits), bias, topk, scale=2.5, num_expert_group=groups,
                                     topk_group=kept)
                expect(f"moe_gate_route {experts}/{topk} groups {groups}/{kept} T={tokens}", ids, want[1])
        tsd.moe_gate_route_check()
        # The split router GEMM (whether or not it is switched on), at every padding of the batch,
        # checked against the front's logits bound through the routing of its own logits.
        for tokens in (1, 16, 17, 64):
            hidden = torch.randn(tokens, width, generator=gen).bfloat16().cuda()
            gate = (torch.randn(experts, width, generator=gen) * width ** -0.5).bfloat16().cuda()
            arrivals = split.counters(hidden.device, experts)
            logits = torch.full((tokens, experts), float("nan"), device="cuda")
            for _ in range(2):  # the counters as the first launch left them
                split.router_logits(hidden, gate, logits, arrivals)
                exact = (hidden.double() @ gate.double().T).float()
                expect(f"router split GEMM {experts} T={tokens}", ((logits - exact).abs() < 1e-3).all(),
                       torch.tensor(True))
    if fuzz_cases and "fuzz" in sections:
        if small:
            fuzz.ELEMENTS = 1 << 20
        bad += len(fuzz.run(0, fuzz_cases))
    torch.cuda.synchronize()
    print(f"matrix: {bad} cases differed", flush=True)
    return bad


def sanitize(tool: str, small: bool, fuzz_cases: int, sections: str) -> tuple[int, str]:
    """(errors compute-sanitizer reported, its summary line) for one tool over the matrix."""
    command = ["compute-sanitizer", "--tool", tool, "--report-api-errors", "no", *TOOLS[tool],
               sys.executable, os.path.abspath(__file__), "--matrix", "--fuzz-cases", str(fuzz_cases),
               "--sections", sections]
    if small:
        command.append("--small")
    started = time.time()
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TSD_SANITIZE_TOOL": tool})
    text = run.stdout + run.stderr
    found = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    hazards = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", text)
    errors = int(found[-1]) if found else -1
    if hazards:
        errors = max(errors, 0) + int(hazards[-1])
    differed = re.findall(r"matrix: (\d+) cases differed", text)
    if not differed or int(differed[-1]) or run.returncode:
        errors = max(errors, 0) + 1  # the matrix itself failed under the tool
    print(text[-3000:] if errors else "", flush=True)
    summary = f"{tool}: {errors} errors ({time.time() - started:.0f} s); " + \
              "; ".join(line.strip() for line in text.splitlines() if "SUMMARY" in line or "matrix:" in line)
    return errors, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", default="memcheck,racecheck,initcheck")
    p.add_argument("--matrix", action="store_true", help="run the case matrix here (inside a tool)")
    p.add_argument("--small", action="store_true", help="smaller rows (racecheck is slow)")
    p.add_argument("--fuzz-cases", type=int, default=60)
    p.add_argument("--sections", default=",".join(SECTIONS), help="of the matrix: " + ", ".join(SECTIONS))
    args = p.parse_args()
    if args.matrix:
        return 1 if matrix(args.small, args.fuzz_cases, args.sections.split(",")) else 0
    total = 0
    for tool in args.tools.split(","):
        slow = tool != "memcheck"  # racecheck and initcheck take ~5 min even on the small matrix
        errors, summary = sanitize(tool, args.small or slow, args.fuzz_cases // 3 if slow else args.fuzz_cases,
                                   args.sections)
        print(summary, flush=True)
        total += errors
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
