#!/bin/bash
# What an opt-in path owes before its switch is turned on by default, on one GPU machine, in
# steps that each fit a bounded run (docs/gpu.md):
#
#   bash tests/opt_in_check.sh STEP [STEP ...]     # from the repository root
#
#   short        the short-row path alone, for a short GPU window: its GPU tests, the short-row table
#                and the profile of its phases (profile_short_row.py --quick)
#   warmup       a fresh process's import + warmup(), twice (Triton's cache empty, then filled),
#                from the folder in TORCH_SPARSE_DECODE_CACHE; Triton's identity
#   tests        the GPU tests of every opt-in path, with every switch on
#   suite        the whole GPU suite with the short-row path on (-n 16), each test named as it ends;
#                then its failures alone with the path off (pytest's --lf), which tells the path's
#                failures from the others
#   fuzz         the fuzzer drawing the switches per case (TSD_FUZZ_OPT_IN=1; FUZZ_CASES, 3000)
#   sanitize     memcheck, then racecheck, over the opt-in paths' sections, every switch on
#   bench        the short-row table, PDL behind the kernel before, the router front
#   peer         beside FlashInfer (.device/peer_bench): top-k at the short rows, the short-row path off and on;
#                routing, the warp kernel on and off
#
# Each step writes ${OUT:-opt_in_logs}/STEP.log, is bounded by STEP_TIMEOUT seconds (540), and
# prints one summary line. Every switch is on in the steps that say so: the fuzzer draws them.
set -u
LOGS=${OUT:-opt_in_logs}
mkdir -p "$LOGS"
LIMIT=${STEP_TIMEOUT:-540}
ALL_ON="TORCH_SPARSE_DECODE_PDL=1 TORCH_SPARSE_DECODE_SHORT_ROWS=1 TORCH_SPARSE_DECODE_ROUTER_SPLIT=1 \
TORCH_SPARSE_DECODE_FRONT_BULK=1 TORCH_SPARSE_DECODE_FRONT_MMA=1 TORCH_SPARSE_DECODE_SHORT_TRIM=1 \
TORCH_SPARSE_DECODE_SHORT_CLUSTER=1 TORCH_SPARSE_DECODE_SHORT_PAIRS=1 TORCH_SPARSE_DECODE_ROUTE_GROUP_WARPS=1"
OPT_IN_TESTS="tests/test_short_row.py tests/test_moe_route.py tests/test_moe_route_warps.py \
tests/test_moe_gate_route_split.py tests/test_moe_gate_route.py tests/test_triton_cache.py"
PDL_TESTS="tests/test_topk_engine_gpu.py tests/test_moe_route.py tests/test_moe_gate_route.py tests/test_dcp.py \
tests/test_dcp_kernels.py"

run() {  # run NAME COMMAND...: bounded, logged, summarized
    local name=$1
    shift
    local began=$SECONDS
    timeout "$LIMIT" bash -c "$*" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - began)) s; last line: $(tail -n 1 "$LOGS/$name.log")"
}

warm_once() {  # a fresh process: import, then warmup(), each timed
    python - <<'EOF'
import time
began = time.perf_counter()
import torch
import torch_sparse_decode as tsd
imported = time.perf_counter() - began
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
began = time.perf_counter()
tsd.warmup(); torch.cuda.synchronize()
print(f"import {imported:.1f} s, warmup() {time.perf_counter() - began:.1f} s")
EOF
}

whole_suite() {  # the GPU suite, the short-row path on; the failures named, then rerun with it off
    TORCH_SPARSE_DECODE_SHORT_ROWS=1 python -m pytest -v --tb=short -m gpu -n 16 -o cache_dir=/tmp/tsd-suite tests \
        >"$LOGS/suite-tests.log" 2>&1
    echo "short path on: $(grep -c ' PASSED' "$LOGS/suite-tests.log") passed; failed, by test:"
    grep -E ' (FAILED|ERROR)' "$LOGS/suite-tests.log" | grep -vE '^(FAILED|ERROR)' | sed 's/.*tests\//tests\//; s/\[.*//' \
        | sort | uniq -c
    if grep -qE ' (FAILED|ERROR)' "$LOGS/suite-tests.log"; then
        echo "the failures alone, the short-row path off:"
        TORCH_SPARSE_DECODE_SHORT_ROWS=0 python -m pytest -q --tb=line -m gpu -n 16 --lf -o cache_dir=/tmp/tsd-suite \
            tests 2>&1 | tail -n 3
    fi
}

for step in "$@"; do
    case $step in
    warmup)
        export -f warm_once
        run warmup "python -c 'from torch_sparse_decode.kernels.triton_cache import identity; print(\"identity\", identity())' \
            && export TRITON_CACHE_DIR=\$(mktemp -d) && warm_once && warm_once" ;;
    short)
        run short "$ALL_ON python -m pytest -v --tb=line -m gpu -n 8 -p no:cacheprovider tests/test_short_row.py \
            && cd benchmarks && $ALL_ON python bench_topk.py --tables short --results '' \
            && python profile_short_row.py --quick --results ''" ;;
    tests)
        run tests "$ALL_ON python -m pytest -v --tb=line -m gpu -n 8 -p no:cacheprovider $OPT_IN_TESTS \
            && $ALL_ON python -m pytest -v --tb=line -m gpu -n 8 -p no:cacheprovider -k 'programmatic or exchange_step' $PDL_TESTS" ;;
    suite)
        export -f whole_suite
        run suite "LOGS=$LOGS whole_suite" ;;
    fuzz)
        run fuzz "TSD_FUZZ_OPT_IN=1 python tests/fuzz.py --seed 1 --cases ${FUZZ_CASES:-3000}" ;;
    sanitize)
        run sanitize "$ALL_ON python tests/sanitize.py --tools memcheck,racecheck --small --fuzz-cases 30 \
            --sections short,dcp,moe,front,fuzz" ;;
    bench)
        run bench "cd benchmarks && $ALL_ON python bench_topk.py --tables short --results '' \
            && python bench_pdl.py --results '' && python bench_moe_gate_route.py --results ''" ;;
    peer)
        run peer "(cd .device/peer_bench && tar xJf libs.tar.xz) && (cd .device/peer_bench/routing && tar xJf libs.tar.xz) \
            && python .device/peer_bench/bench_fi.py --shapes 1x8K,8x8K,64x8K,256x8K --kinds randn,ragged --budget-s 200 \
            && TORCH_SPARSE_DECODE_SHORT_ROWS=1 python .device/peer_bench/bench_fi.py --shapes 1x8K,8x8K,64x8K,256x8K \
               --kinds randn,ragged --budget-s 200 \
            && python .device/peer_bench/routing/bench_route.py --configs dsv3,kimi_k2 --tokens 1,64,256,1024,2048,4096 \
            && TORCH_SPARSE_DECODE_ROUTE_WARPS=0 python .device/peer_bench/routing/bench_route.py --configs dsv3,kimi_k2 \
               --tokens 1024,2048,4096" ;;
    *)
        echo "unknown step $step (short warmup tests suite fuzz sanitize bench peer)" >&2
        exit 2 ;;
    esac
done
