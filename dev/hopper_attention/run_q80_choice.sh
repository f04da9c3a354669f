#!/usr/bin/env bash
# run_q80_choice.sh: the one-call GPU script of the per-mask choice between the 64-row (base) and
# 80-row (q80) backward at D = 128 (README section "Masked backward at D = 128 on q80"), from the
# repository root of an H100/H200 machine with torch, carry [".carry/q34"], everything built here
# beforehand from a `git archive` of the commit (no build there):
#   .carry/q34/lab/  hopper_bwd_test and libhopper_mask.so (build.sh's nvcc lines, -I the archive's src)
#   .carry/q34/tb/   the library's test_backends (Ninja, sm_90a, build-offload's settings; it needs
#                    cudart, nvrtc and cudnn there: cudnn from PyTorch's wheel, scripts/gpu_env.sh)
# Steps, each capped, in the order they matter: the lab's checks (fp64 oracle, bf16 rule: base
# and q80 on the same inputs, dense and masked), the backend's cases with tile lists now routed
# per mask (test_backends, the ctest filter "BackendVsOracle|HopperBackend" plus the CPU
# HopperTiles cases), then ab_masks.py at 32K (both variants, and the one the backend routes each
# mask to, against compiled flex_attention; dense causal against cuDNN); 128K in the time left.
# Logs in $OUT; ab_masks.py prints one JSON line per mask, so a step cut by its cap keeps its
# finished masks.
set -u
out=${OUT:-out_q80c}; BUDGET=${BUDGET:-230}
source dev/hopper_attention/lab_call.sh
here=dev/hopper_attention; c=.carry/q34
chmod +x $c/lab/hopper_bwd_test $c/tb/test_backends
timeout 50 $c/lab/hopper_bwd_test check 128 base,q80 all > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
(
  source scripts/gpu_env.sh > /dev/null 2>&1
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  timeout 70 $c/tb/test_backends --gtest_filter='*BackendVsOracle*:*HopperBackend*:*HopperTiles*' --gtest_brief=1
  echo "test_backends rc=$?"
) > "$out/gtest.log" 2>&1
say "backend: $(grep -E 'PASSED|FAILED|rc=' $out/gtest.log | tr '\n' ' ' | cut -c1-300)"
grep -E "^\[  FAILED|error|Failure" "$out/gtest.log" | head -n 12 >> "$out/summary.txt"
l=$(left)
timeout $((l > 20 ? l : 20)) python3 $here/ab_masks.py --lib $c/lab/libhopper_mask.so --seqs 32768 \
  --masks ${MASKS:-docs64,docs16,docs256,window1024,window16384,window4096,bigbird} --bwd-variants base,q80 \
  --rounds 3 --reps 2 > "$out/ab_masks_32k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_32k.log"
say "A/B 32K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_32k.log" >> "$out/summary.txt"
grep -E "check_vs_flex|Error|error|A/B rc" "$out/ab_masks_32k.log" | head -n 20 >> "$out/summary.txt"
if [ $(left) -gt 80 ]; then
  timeout $(left) python3 $here/ab_masks.py --lib $c/lab/libhopper_mask.so --seqs 131072 \
    --masks docs64,docs16,docs256,window4096,bigbird --bwd-variants base,q80 --rounds 2 --reps 1 \
    > "$out/ab_masks_128k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_128k.log"
  say "A/B 128K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_128k.log" >> "$out/summary.txt"
fi
say "end"
