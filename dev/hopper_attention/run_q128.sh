#!/usr/bin/env bash
# run_q128.sh: the one-call GPU script of the D = 64 backward with 128-row query tiles ("q128";
# README section "Backward at D = 64: 128-row query tiles"): the library's test_backends in the
# background; the lab's build; the checks (CPU fp64 oracle, bf16 rule: D = 64 base and q128 on the
# same inputs, dense and masked; D = 128 base, whose kernel is the same template); the whole
# backward standalone, base vs q128 (order base q128 q128 base); ab_bwd.py (base, q128 and cuDNN
# SDPA interleaved; uniform [-1, 1) q, k, v, dO; H = 32, H_kv 32 and 8; full and causal); NCU=1 an
# Nsight Compute reading of both main kernels; the backend's ctest cases. From the repository root
# on an H100/H200 with carry [".carry"]; logs in $OUT. Variables: SEQS (bench), AB_SEQS.
set -u
out=${OUT:-out_q128}; t0=$(date +%s)
SEQS=${SEQS:-"16384 32768"}
AB_SEQS=${AB_SEQS:-"8192,16384,32768"}
source dev/hopper_attention/lab_start.sh
{
  timeout 90 $bwd check 64 base,q128 all || echo "CHECK-FAILED bwd 64 base,q128"
  timeout 90 $bwd check 128 base all || echo "CHECK-FAILED bwd 128 base"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
{
  for S in $SEQS; do for c in 0 1; do
    for v in 0 4 4 0; do timeout 30 $bwd bench $S $c 32 32 64 5 $v || echo "BENCH-FAILED $S $c $v"; done
  done; done
  for v in 0 4 4 0; do timeout 30 $bwd benchmask 32768 docs:16 32 32 64 5 $v || echo "BENCH-FAILED docs:16 $v"; done
  if command -v ncu >/dev/null && [ "${NCU:-0}" = 1 ]; then
    for v in 0 4; do
      timeout 90 ncu -k regex:bwd_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        $bwd bench 16384 1 32 32 64 1 $v 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU bwd v$v /" | tail -n 40
    done
  fi
} > "$out/bench.log" 2>&1
say "benches done"; grep -E "^BENCH bwd variant=[0-9] S=[0-9]+ causal=[01] H|^BENCHMASK|BENCH-FAILED" "$out/bench.log" | sed 's/ (min [0-9.]* max [0-9.]*)//; s/visible=.*boundary=[0-9]* //' >> "$out/summary.txt"
timeout 240 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so --bwd-lib $here/build/libhopper_bwd.so \
  --seqs "$AB_SEQS" --kv-heads 32,8 --dim 64 --variants base,q128 > "$out/ab_bwd.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_bwd.log"
say "A/B:"; grep -E "^SUMMARY|SUSPECT|Error|rc=" "$out/ab_bwd.log" >> "$out/summary.txt"
waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 90 ]; do sleep 2; waited=$((waited + 2)); done
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
if [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (cd build-gpu && timeout 100 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
say "end"
