#!/usr/bin/env bash
# run_persist.sh: the one-call GPU script of the persistent forward (issue 34, next steps 1;
# README section "Persistent forward"), from the repository root on an H100/H200 with CUDA 13 and
# torch, carry [".carry"]: the library's test_backends in the background; the lab's build; the
# checks (CPU fp64 oracle, dense and masked) of every variant in VARS (D = 128) and VARS64
# (D = 64); standalone benches of those variants (dense full and causal at 8K-32K with H = 32 and
# at 128K with H = 8; docs:256, bigbird:128, docs:16 at 32K; D = 64 at 8K and 32K), each case in
# the list's order then reversed; ab_compare.py (AB / AB64 variants and cuDNN SDPA interleaved in
# one process) at 8K-32K, full and causal, H 32:32 and 32:8 (D = 128) and 32:32 (D = 64); the
# backend's ctest cases in the time left; NCU=1 adds an Nsight Compute reading (32K dense full).
# About 380 s at most; logs in $OUT (8 files; 9 with NCU=1: lab_build.log is then dropped).
set -u
out=${OUT:-out_persist}; t0=$(date +%s); deadline=$((t0 + 380))
left() { echo $((deadline - $(date +%s))); }
VARS=${VARS:-"pp192 persist192"}; VARS64=${VARS64:-"m192 persist_m192"}
AB=${AB:-pp192,persist192}; AB64=${AB64:-m192,persist_m192}
both() { echo "$1 $(echo $1 | tr ' ' '\n' | tac | tr '\n' ' ')"; }  # the list, then reversed
source dev/hopper_attention/lab_start.sh
{
  for v in $VARS; do timeout 60 $fwd check $v 128 all || echo "CHECK-FAILED fwd $v"; done
  for v in $VARS64; do timeout 60 $fwd check $v 64 all || echo "CHECK-FAILED fwd $v"; done
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
{
  for S in 8192 16384 32768; do for c in 0 1; do
    for v in $(both "$VARS"); do timeout 30 $fwd bench $v $S $c 32 32 128 10 || echo "BENCH-FAILED $v $S $c"; done
  done; done
  for m in docs:256 bigbird:128 docs:16; do
    for v in $(both "$VARS"); do timeout 30 $fwd benchmask $v 32768 $m 32 32 128 10 || echo "BENCH-FAILED $v $m"; done
  done
  for c in 0 1; do
    for v in $(both "$VARS"); do timeout 40 $fwd bench $v 131072 $c 8 8 128 5 || echo "BENCH-FAILED $v 128K $c"; done
  done
  for S in 8192 32768; do for c in 0 1; do
    for v in $(both "$VARS64"); do timeout 30 $fwd bench $v $S $c 32 32 64 10 || echo "BENCH-FAILED $v $S $c"; done
  done; done
} > "$out/bench.log" 2>&1
say "benches done"
grep -hE "^BENCH|BENCH-FAILED" "$out/bench.log" | sed 's/ (min [0-9.]* max [0-9.]*)//; s/visible=.*boundary=[0-9]* //' >> "$out/summary.txt"
timeout 160 python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so --seqs 8192,16384,32768 \
  --variants $AB --kv-heads 32,8 --dim 128 --rounds 8 --reps 4 > "$out/ab128.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab128.log"
say "A/B D=128:"; grep -E "^AB |CHECKBIG|A/B rc|Error" "$out/ab128.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
l=$(left); [ $l -gt 30 ] && { timeout $((l < 90 ? l : 90)) python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so \
  --seqs 8192,16384,32768 --variants $AB64 --kv-heads 32 --dim 64 --rounds 8 --reps 4 > "$out/ab64.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab64.log"; }
say "A/B D=64:"; grep -E "^AB |CHECKBIG|A/B rc|Error" "$out/ab64.log" 2>/dev/null | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
# Nsight Compute (NCU=1): one launch each of the old and new D = 128 kernels at 32K dense full
# (the case where the persistent kernel is slower), at ncu's fixed clocks.
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && [ $(left) -gt 90 ]; then
  for v in $(both "$VARS"); do
    timeout 40 ncu -k regex:fwd_ --launch-skip 3 -c 1 --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,smsp__inst_executed.sum \
      $fwd bench $v 32768 0 32 32 128 1 2>&1 | grep -E "fwd_|duration|per_second|pct|sum" | sed "s/^/NCU $v /"
  done > "$out/ncu.log" 2>&1
  say "ncu:"; grep -E "duration|hmma|hit_rate|dram|lts__t_bytes|inst_executed" "$out/ncu.log" | awk '{print $2, $3, $(NF)}' >> "$out/summary.txt"
fi
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
l=$(left)
if [ $l -gt 15 ] && [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (cd build-gpu && timeout $l ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "ctest skipped (library not built in time or no time left)"; kill $lib_pid 2>/dev/null; fi
[ "${NCU:-0}" = 1 ] && rm -f "$out/lab_build.log"  # at most 8 files come back
say "end"
