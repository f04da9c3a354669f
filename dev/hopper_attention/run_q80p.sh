#!/usr/bin/env bash
# run_q80p.sh: the one-call GPU script of the persistent D = 128 backward for tile lists (q80p,
# bwd_persist_lab.cuh; README section "Persistent backward for tile lists"), from the repository
# root of an H100/H200 machine with torch, carry [".carry/pb"], built here beforehand with
# build.sh's nvcc lines (no build there):
#   .carry/pb/  hopper_bwd_test, hopper_fwd_test, libhopper_mask.so
# Steps, each capped, in the order they matter: the lab's checks (fp64 oracle, bf16 rule: q80,
# q80p on its full grid and q80p3 on 3 CTAs, dense and masked; the forward persist192u on the
# masked cases, the backend's dense-causal kernel, not yet run on lists), q80 / q80p standalone
# on 16 documents at 32K, then ab_masks.py at 32K (q80 and q80p; our forward as the backend runs
# it: persist192 on lists, persist192u on dense causal, with pp192 and persist192u timed beside it;
# flex and cuDNN in the same rounds), 128K, and 32K with GQA 32:8, in the time left.
# Logs in $OUT; ab_masks.py prints one JSON line per mask, so a step cut by its cap keeps its
# finished masks.
set -u
out=${OUT:-out_q80p}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-300}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
here=dev/hopper_attention; c=.carry/pb
chmod +x $c/hopper_bwd_test $c/hopper_fwd_test
timeout 60 $c/hopper_bwd_test check 128 q80,q80p,q80p3 all > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "bwd checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
timeout 40 $c/hopper_fwd_test check persist192u 128 masks >> "$out/checks.log" 2>&1 || echo "FWD-CHECK-FAILED rc=$?" >> "$out/checks.log"
say "fwd checks: $(grep -E 'cases pass|FWD-CHECK-FAILED' $out/checks.log | tail -n 2 | tr '\n' ';')"
grep -c '^FAIL' "$out/checks.log" > /dev/null && grep '^FAIL' "$out/checks.log" | head -n 5 >> "$out/summary.txt"
# Standalone: the whole backward (memset, preprocessing, main kernel, conversion), q80 then q80p
# then q80p then q80, median of 10 launches each.
for v in 5 6 6 5; do
  timeout 30 $c/hopper_bwd_test benchmask 32768 docs:16 32 32 128 10 $v 2>&1 | grep -E "BENCH" >> "$out/bench.log"
done
for v in 5 6; do
  timeout 40 $c/hopper_bwd_test bench 32768 1 32 32 128 5 $v 2>&1 | grep -E "BENCH" >> "$out/bench.log"
done
say "standalone:"; cat "$out/bench.log" >> "$out/summary.txt"
ab() {  # ab <log> <cap> <args...>
  local log=$1 cap=$2; shift 2
  timeout $cap python3 $here/ab_masks.py --lib $c/libhopper_mask.so --bwd-variants q80,q80p --causal-ref q80 \
    --fwd persist192 --fwd-causal persist192u --fwd-variants pp192,persist192u "$@" > "$out/$log" 2>&1 \
    || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log:"; sed -n '/^SUMMARY/,$p' "$out/$log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error|A/B rc" "$out/$log" | head -n 20 >> "$out/summary.txt"
}
l=$(left); ab ab_32k.log $((l > 30 ? l : 30)) --seqs 32768 --masks ${MASKS:-docs16,window4096,docs64,window16384} --rounds 3 --reps 2
if [ $(left) -gt 70 ]; then ab ab_128k.log $(left) --seqs 131072 --masks docs16,window4096,docs64 --rounds 2 --reps 1; fi
if [ $(left) -gt 40 ]; then ab ab_32k_gqa.log $(left) --seqs 32768 --masks docs16,window4096 --kv-heads 8 --rounds 3 --reps 2; fi
say "end"
