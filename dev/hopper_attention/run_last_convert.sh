#!/usr/bin/env bash
# run_last_convert.sh: the one-call GPU script of session w's dQ conversion by each tile's last
# contributor (short64c: hopper_bwd_short.cuh with launch_bwd_short's last_converts; README section
# "The dQ tile converted by its last contributor (session w)"), from the repository root on an H200
# with torch; carry ["dev/hopper_attention/build/w1"] (hopper_bwd_test and libhopper_mask.so, built
# here with build.sh bwd and mask, stripped). Steps, each capped, in the order they matter:
#   1. the lab's masked checks, fp64 oracle, bf16 rule: hopper_bwd_test check 128 short64,short64c
#      masks, then short64c again with LAB_CONVERT_CAP=1 (a CTA converts at most one tile, so the
#      rest kernel converts most of them: that path checked too);
#   2. only if every check passes: the whole backward alone, standalone (benchmask, order
#      6 7 7 6: short64, short64c) on 256 documents at 8K, 32K and 128K;
#   3. ab_masks.py --fb-all, backward variants short64 and short64c, each after persist64's
#      forward, against compiled flex on the same mask: 256 documents at 32K, 128K (and 8K, 64K).
set -u
out=${OUT:-out_lastconv}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-400}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
here=dev/hopper_attention; bd=${BUILD:-$here/build/w1}; bwd=$bd/hopper_bwd_test; lib=$bd/libhopper_mask.so
chmod +x $bwd 2>/dev/null
if ! "$bwd" 2>&1 | grep -qi usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: stop"; say "end"; exit 1
fi
check() {  # check <log> [env...]
  local log=$1; shift
  env "$@" timeout 60 $bwd check 128 ${CHECK_VARIANTS:-short64,short64c} masks > "$out/$log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/$log"
  say "checks $log ($*): $(grep -c '^PASS' $out/$log) PASS, $(grep -c '^FAIL' $out/$log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/$log | tr '\n' ';')"
  grep -E '^FAIL|CHECK-FAILED|rror' "$out/$log" | head -n 12 >> "$out/summary.txt"
  ! grep -qE '^FAIL|CHECK-FAILED' "$out/$log" && grep -q 'cases pass' "$out/$log"
}
check checks.log || { say "checks failed: no timing"; say "end"; exit 1; }
CHECK_VARIANTS=short64c check checks_cap1.log LAB_CONVERT_CAP=1 || { say "cap-1 checks failed: no timing"; say "end"; exit 1; }
for S in ${BENCH_SEQS:-8192 32768 131072}; do
  for v in 6 7 7 6; do
    timeout 30 $bwd benchmask $S docs:256 32 32 128 20 $v 2>&1 | grep -E "BENCH|rror" | sed "s/^/S=$S v=$v /" >> "$out/bench.log"
  done
done
say "standalone (6 short64, 7 short64c):"; sed -E 's/ \(min [0-9.]* max [0-9.]*\)//' "$out/bench.log" >> "$out/summary.txt"
ab() {  # ab <log> <cap> <args...>
  local log=$1 cap=$2; shift 2
  local l=$(left); if [ $l -lt 30 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  timeout $cap python3 $here/ab_masks.py --lib $lib --fwd persist192 --fwd-causal persist192u --fwd-variants persist64 \
    --bwd-variants short64,short64c --causal-ref q80 --fb-all --skip-causal "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($*):"; sed -n '/^SUMMARY per backward/,$p' "$out/$log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error|A/B rc" "$out/$log" | head -n 12 >> "$out/summary.txt"
}
for S in ${AB_SEQS:-32768 131072 8192 65536}; do
  ab ab_$((S / 1024))k.log ${CAP:-120} --seqs $S --masks ${MASKS:-docs256} --rounds 3 --reps 2
done
say "end"
