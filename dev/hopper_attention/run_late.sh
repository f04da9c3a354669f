#!/usr/bin/env bash
# run_late.sh: the one-call GPU script of the D = 128 backward's options (README section
# "Backward at D = 128": lateq, lateqs, dqred, lateqr): the lab's build (ptxas report); the checks
# (CPU fp64 oracle, bf16 rule; D = 128 base and the variants on the same inputs, dense and masked);
# ab_bwd.py (base, the variants and cuDNN SDPA interleaved; uniform [-1, 1) q, k, v, dO; H = 32, H_kv 32
# and 8; full and causal); Nsight Compute of the main kernels (16K, H = 32, D = 128: tensor pipe,
# stall reasons per issued instruction, L2 and DRAM bytes). BACKEND=1 also builds the library's
# test_backends and runs the backend's ctest cases. From the repository root on an H100/H200 with
# carry [".carry"]; logs in $OUT. Variables: AB_SEQS, AB_VARIANTS, ROUNDS, NCU_CASES ("S:causal:v ..."),
# CHECK64 (variants also checked at D = 64), BENCH_PAIR ("a b": variant numbers timed standalone,
# order a b b a), BENCH_CASES ("S:causal ...").
set -u
out=${OUT:-out_late}; t0=$(date +%s)
AB_SEQS=${AB_SEQS:-"8192,16384,32768"}
AB_VARIANTS=${AB_VARIANTS:-"base,lateq,lateqs"}
ROUNDS=${ROUNDS:-5}
NCU_CASES=${NCU_CASES:-"16384:1:0 16384:1:6 16384:0:0 16384:0:6"}
LAB_LIB=${BACKEND:-0}
source dev/hopper_attention/lab_start.sh
elapsed() { echo $(( $(date +%s) - t0 )); }
cp $here/build/ptxas_bwd.txt "$out/ptxas_bwd.txt" 2>/dev/null
grep -A2 "Compiling entry function '_ZN6seqpar6hopper10bwd_kernel" $here/build/ptxas_bwd.txt | grep -E "spill" | sort | uniq -c >> "$out/summary.txt"
grep -c "C7512\|C7515\|C7517" $here/build/ptxas_bwd.txt | sed 's/^/C7512|C7515|C7517 notes (defer has C7515): /' >> "$out/summary.txt"
{
  timeout 80 $bwd check 128 ${AB_VARIANTS} all || echo "CHECK-FAILED bwd 128 rc=$?"
  [ -n "${CHECK64:-}" ] && { timeout 60 $bwd check 64 ${CHECK64} all || echo "CHECK-FAILED bwd 64 rc=$?"; }
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
timeout 130 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so --bwd-lib $here/build/libhopper_bwd.so \
  --seqs "$AB_SEQS" --kv-heads 32,8 --dim 128 --variants "$AB_VARIANTS" --rounds $ROUNDS > "$out/ab_bwd.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_bwd.log"
say "A/B:"; grep -E "^SUMMARY|SUSPECT|Error|rc=|CHECKREF" "$out/ab_bwd.log" >> "$out/summary.txt"
# The whole backward standalone (5 back-to-back calls, median), order a b b a per case.
if [ -n "${BENCH_PAIR:-}" ]; then
  read va vb <<< "$BENCH_PAIR"
  for c in ${BENCH_CASES:-16384:1 16384:0 32768:1 32768:0}; do
    IFS=: read S causal <<< "$c"
    for v in $va $vb $vb $va; do timeout 30 $bwd bench $S $causal 32 32 128 5 $v 2>&1 | grep -E "^BENCH bwd variant=[0-9] S=[0-9]+ causal=[01] H" ; done
  done > "$out/bench.log" 2>&1
  sed 's/ (min [0-9.]* max [0-9.]*)//' "$out/bench.log" >> "$out/summary.txt"
fi
if command -v ncu >/dev/null; then
  for c in $NCU_CASES; do
    [ $(elapsed) -gt ${NCU_UNTIL:-250} ] && { say "ncu skipped from $c (time)"; break; }
    IFS=: read S causal v <<< "$c"
    timeout 45 ncu -k regex:bwd_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes.sum,sm__cycles_elapsed.avg.per_second,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      $bwd bench $S $causal 32 32 128 1 $v 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU S=$S causal=$causal v$v /" >> "$out/ncu.log"
  done
  grep -E "Duration|tensor_op|lts__t_bytes|dram__bytes|Issued Warp|Warp Cycles Per Issued|stalled_(barrier|long_scoreboard|wait|math_pipe|short_scoreboard|mio|sleeping|membar|dispatch|selected)" "$out/ncu.log" >> "$out/summary.txt"
fi
if [ "$LAB_LIB" = 1 ]; then
  waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 120 ]; do sleep 2; waited=$((waited + 2)); done
  if ! kill -0 $lib_pid 2>/dev/null; then
    (cd build-gpu && timeout 100 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
    say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
    grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
  else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
fi
say "end"
