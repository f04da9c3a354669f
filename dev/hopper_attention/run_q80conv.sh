#!/usr/bin/env bash
# run_q80conv.sh: the one-call GPU script of the q80 backward's fixed part (README section "The
# 80-row dQ conversion"): the commit before (old) and the working tree (new) side by side. From the
# repository root of an H100/H200 machine with torch, carry [".carry/conv"], everything built here
# beforehand (no build there):
#   .carry/conv/before/  hopper_bwd_test, libhopper_bwd.so of the commit before (git archive, the
#                        nvcc lines of build.sh)
#   .carry/conv/after/   the same of that commit + this tree's hopper_bwd_launch.cuh
#   .carry/conv/libhopper_fwd.so  the lab's forward (O and LSE for ab_bwd.py; ab_compare.py)
#   .carry/conv/tb/      the library's test_backends (build-offload, sm_90a)
# Steps, each capped, in order of need: the checks (new: fp64 oracle, bf16 rule, D = 128 base and
# q80 and D = 64 q128, dense and masked); Nsight Compute of the preprocessing and conversion kernels
# (old, new; 8K and 32K, H = 32; --clock-control none); the fixed part timed alone (FIXED: memset +
# preprocessing + conversion, old new new old); the backend's cases; ab_bwd.py with old and new
# interleaved with cuDNN (8K-32K, then 64K and 128K); in the time left ab_compare.py (forward) at
# 64K and 128K. Logs in $OUT.
set -u
out=${OUT:-out_q80conv}; BUDGET=${BUDGET:-300}
source dev/hopper_attention/lab_call.sh
say "rev $(git rev-parse --short HEAD 2>/dev/null) + working tree"
here=dev/hopper_attention; c=.carry/conv
old=$c/before/hopper_bwd_test; new=$c/after/hopper_bwd_test
{
  timeout 60 $new check 128 base,q80 all || echo "CHECK-FAILED bwd 128 rc=$?"
  timeout 30 $new check 64 q128 all || echo "CHECK-FAILED bwd 64 rc=$?"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
# The fixed kernels do not depend on the mask or H_kv: one problem per length.
for S in 8192 32768; do
  for b in old new; do
    bin=$old; [ $b = new ] && bin=$new
    timeout 40 ncu --clock-control none -k regex:"preprocess|convert" -c 2 --section SpeedOfLight \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      $bin bench $S 0 32 32 128 1 5 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU S=$S $b /"
  done
done > "$out/ncu.log" 2>&1
grep -E "bwd_(preprocess|convert)|gpu__time_duration|dram__bytes|bank_conflicts|inst_executed|DRAM Throughput" "$out/ncu.log" \
  | sed 's/  */ /g' >> "$out/summary.txt"
for spec in 8192:0:32:5 8192:1:8:5 32768:0:32:5 32768:1:8:5 131072:1:8:2; do  # S:causal:H_kv:reps
  IFS=: read S causal hkv reps <<< "$spec"
  for b in $old $new $new $old; do
    echo "$b"; timeout 40 $b bench $S $causal 32 $hkv 128 $reps 5 2>&1 | grep -E "^(BENCH|FIXED) bwd"
  done
done > "$out/fixed.log" 2>&1
say "fixed part (old new new old):"; grep -E "^FIXED|ms=" "$out/fixed.log" | grep -v "main kernel only" \
  | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
(
  source scripts/gpu_env.sh > /dev/null 2>&1
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  # 4 shards at once: one process over the 32 cases outran 60 s (call 1); the shards took 31-50 s.
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 75 $c/tb/test_backends \
      --gtest_filter='*BackendVsOracle*:*HopperBackend*' --gtest_brief=1 > "$out/gtest$i.log" 2>&1 &
  done
  wait
  cat "$out"/gtest[0-3].log; rm -f "$out"/gtest[0-3].log
) > "$out/gtest.log" 2>&1
say "backend: $(grep -E 'PASSED|FAILED' $out/gtest.log | tr '\n' ' ' | cut -c1-300)"
grep -E "^\[  FAILED|error|Failure" "$out/gtest.log" | head -n 12 >> "$out/summary.txt"
ab() {  # ab SEQS ROUNDS REPS LOG
  timeout $(left) python3 $here/ab_bwd.py --fwd-lib $c/libhopper_fwd.so --bwd-lib $c/after/libhopper_bwd.so \
    --extra-lib before=$c/before/libhopper_bwd.so --variants q80@before,q80 --seqs $1 --kv-heads 32,8 --dim 128 \
    --rounds $2 --reps $3 > "$out/$4" 2>&1 || echo "A/B rc=$?" >> "$out/$4"
  say "A/B $1:"; grep -E "^SUMMARY|SUSPECT|Error|rc=|CHECKREF" "$out/$4" >> "$out/summary.txt"
}
ab 8192,16384,32768 5 2 ab_bwd.log
[ $(left) -gt 90 ] && ab 65536,131072 3 1 ab_bwd_long.log
if [ $(left) -gt 40 ]; then
  timeout $(left) python3 $here/ab_compare.py --lib $c/libhopper_fwd.so --seqs 65536,131072 --variants pp192,persist192u \
    --kv-heads 32,8 --dim 128 --rounds 3 --reps 2 > "$out/ab_fwd_long.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_fwd_long.log"
  say "forward A/B 64K, 128K:"; grep -E "^AB |SUMMARY|Error|rc=|CHECKBIG" "$out/ab_fwd_long.log" >> "$out/summary.txt"
fi
say "end"
