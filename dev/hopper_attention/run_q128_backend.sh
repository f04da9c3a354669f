#!/usr/bin/env bash
# run_q128_backend.sh: the second one-call GPU script of the D = 64 backward with 128-row query
# tiles (README "Backward at D = 64: 128-row query tiles", run 2): the library's test_backends
# and test_probe/seqpar_cli in the background; the lab's build and checks (D = 64 base and q128,
# D = 128 base); ab_bwd.py again (base, q128, cuDNN interleaved; 8K-32K, H_kv 32 and 8, full and
# causal; 7 rounds); D = 128 base standalone (the template it shares); Nsight Compute of both D = 64
# main kernels (16K causal); the backend's ctest cases, the auto routing's (AutoBackend) and the
# planner's pricing of auto's packs (PlanCli.BackendPricesTheQueryPacksItMoves). From the
# repository root on an H100/H200 with carry [".carry"]; logs in $OUT.
set -u
out=${OUT:-out_q128b}; t0=$(date +%s)
source dev/hopper_attention/lab_start.sh
{
  timeout 90 $bwd check 64 base,q128 all || echo "CHECK-FAILED bwd 64 base,q128"
  timeout 90 $bwd check 128 base all || echo "CHECK-FAILED bwd 128 base"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
timeout 200 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so --bwd-lib $here/build/libhopper_bwd.so \
  --seqs 8192,16384,32768 --kv-heads 32,8 --dim 64 --variants base,q128 --rounds 7 > "$out/ab_bwd.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_bwd.log"
say "A/B:"; grep -E "^SUMMARY|SUSPECT|Error|rc=" "$out/ab_bwd.log" >> "$out/summary.txt"
{
  for S in 16384 32768; do for c in 0 1; do timeout 30 $bwd bench $S $c 32 32 128 5 0 || echo "BENCH-FAILED $S $c"; done; done
  if command -v ncu >/dev/null; then
    for v in 0 4; do
      timeout 60 ncu -k regex:bwd_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        $bwd bench 16384 1 32 32 64 1 $v 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU bwd v$v /" | tail -n 45
    done
  fi
} > "$out/bench.log" 2>&1
say "benches done"; grep -E "^BENCH bwd variant=[0-9] S=[0-9]+ causal=[01] H|BENCH-FAILED|Duration|tensor_op|Compute \(SM\) Thr|Issued Warp" "$out/bench.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 90 ]; do sleep 2; waited=$((waited + 2)); done
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
if [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (source scripts/gpu_env.sh; nice cmake --build build-gpu -j 24 --target test_probe seqpar_cli 2>&1 | grep -E "error|Linking" | tail -n 5) > "$out/probe_build.log" 2>&1
  (cd build-gpu && timeout 120 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend|AutoBackend|PlanCli.BackendPrices" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*|AutoBackend|PlanCli" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
say "end"
