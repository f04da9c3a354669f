#!/usr/bin/env bash
# run_q80_masks.sh: the one-call GPU script of the masked D = 128 backward on q80 (README section
# "Masked backward at D = 128 on q80"), from the repository root of an H100/H200 machine with
# torch, carry [".carry/m34"], everything built here beforehand (no build there):
#   .carry/m34/lab/  hopper_bwd_test and libhopper_mask.so of the working tree (`bash
#                    dev/hopper_attention/build.sh bwd` and `... mask`, copied there; call 1 ran
#                    build.sh's nvcc lines with another output folder, since build/ is shared)
#   .carry/m34/tb/   the library's test_backends (build-offload, Ninja, sm_90a; it needs only
#                    cudart, nvrtc and cudnn there: cudnn from PyTorch's wheel, scripts/gpu_env.sh)
#   .carry/m34/old/  hopper_bwd_test of the commit before (for the dense q80 before / after;
#                    git archive of that commit, the same nvcc line)
# Steps, each capped: the lab's checks (fp64 oracle, bf16 rule: D = 128 base and q80 on the same
# inputs, dense and masked; D = 64 q128 masked), the backend's cases (test_backends, the ctest
# filter "BackendVsOracle|HopperBackend" as a gtest filter), ab_masks.py at 32K (ours with base
# and q80 against compiled flex_attention, dense causal against cuDNN), then, in the time left,
# the dense q80 backward standalone old / new and ab_masks.py at 128K. Logs in $OUT.
set -u
out=${OUT:-out_q80m}; BUDGET=${BUDGET:-160}
source dev/hopper_attention/lab_call.sh
say "rev $(git rev-parse --short HEAD 2>/dev/null) + working tree"
here=dev/hopper_attention; c=.carry/m34
bwd=$c/lab/hopper_bwd_test; old=$c/old/hopper_bwd_test
{
  timeout 50 $bwd check 128 base,q80 all || echo "CHECK-FAILED bwd 128 rc=$?"
  timeout 20 $bwd check 64 q128 masks || echo "CHECK-FAILED bwd 64 rc=$?"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
(
  source scripts/gpu_env.sh > /dev/null 2>&1
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  timeout 50 $c/tb/test_backends --gtest_filter='*BackendVsOracle*:*HopperBackend*' --gtest_brief=1
  echo "test_backends rc=$?"
) > "$out/gtest.log" 2>&1
say "backend: $(grep -E 'PASSED|FAILED|rc=' $out/gtest.log | tr '\n' ' ' | cut -c1-300)"
grep -E "^\[  FAILED|error|Failure" "$out/gtest.log" | head -n 12 >> "$out/summary.txt"
l=$(left)
timeout $((l > 20 ? l : 20)) python3 $here/ab_masks.py --lib $c/lab/libhopper_mask.so --seqs 32768 \
  --masks ${MASKS:-docs16,window4096,docs256,bigbird} --bwd-variants base,q80 --rounds 3 --reps 2 \
  > "$out/ab_masks_32k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_32k.log"
say "A/B 32K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_32k.log" >> "$out/summary.txt"
grep -E "check_vs_flex|Error|error|A/B rc" "$out/ab_masks_32k.log" | head -n 16 >> "$out/summary.txt"
if [ $(left) -gt 25 ] && [ -x $old ]; then
  # The dense q80 backward (variant 5), commit before / working tree, 32K causal, order old new new old.
  for b in $old $bwd $bwd $old; do
    echo "$b"; timeout 12 $b bench 32768 1 32 32 128 5 5 2>&1 | grep -E "^BENCH bwd"
  done > "$out/bench_dense.log" 2>&1
  say "dense q80 old/new/new/old:"; grep -E "ms=" "$out/bench_dense.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
fi
if [ $(left) -gt 80 ]; then
  timeout $(left) python3 $here/ab_masks.py --lib $c/lab/libhopper_mask.so --seqs 131072 \
    --masks docs16,window4096,docs256,bigbird --bwd-variants base,q80 --rounds 2 --reps 1 \
    > "$out/ab_masks_128k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_128k.log"
  say "A/B 128K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_128k.log" >> "$out/summary.txt"
fi
say "end"
