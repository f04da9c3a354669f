#!/usr/bin/env bash
# run_masks.sh: the one-call GPU script of the masks (visible-tile lists, issue 34; README section
# "Masks as visible-tile lists"), from the repository root on an H100/H200 machine with CUDA 13 and
# torch, carry [".carry"] (the library build's dependencies): the library's test_backends in the
# background; the lab's build, checks (dense and masked, D = 128 and 64) and benches (dense causal
# and every mask at 32K and 128K, TFLOP/s of visible scores); ab_masks.py (ours vs compiled
# flex_attention with the same masks, our causal vs cuDNN) at 32K; the backend's ctest cases; then
# ab_masks.py at 128K in the time left (about 7 minutes in all). Logs in $OUT (8 files).
set -u
out=${OUT:-out_masks}; t0=$(date +%s); deadline=$((t0 + 395))
left() { echo $((deadline - $(date +%s))); }
source dev/hopper_attention/lab_start.sh
{
  timeout 60 $fwd check pp192 128 all || echo "CHECK-FAILED fwd pp192"
  timeout 60 $fwd check m192 64 all || echo "CHECK-FAILED fwd m192"
  timeout 60 $bwd check 128 base all || echo "CHECK-FAILED bwd 128"
  timeout 60 $bwd check 64 base all || echo "CHECK-FAILED bwd 64"
} > "$out/lab_checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/lab_checks.log) PASS, $(grep -c '^FAIL' $out/lab_checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/lab_checks.log | tr '\n' ';')"
for S in 32768 131072; do
  timeout 30 $fwd bench pp192 $S 1 32 32 128 10
  for m in docs:16 docs:256 window:4096,0 window:16384,0 bigbird:128; do timeout 30 $fwd benchmask pp192 $S $m 32 32 128 10; done
  timeout 60 $bwd bench $S 1 32 32 128 5 0
  for m in docs:16 docs:256 window:4096,0 window:16384,0 bigbird:128; do timeout 40 $bwd benchmask $S $m 32 32 128 5; done
done > "$out/lab_bench.log" 2>&1
say "benches done"
timeout 110 python3 $here/ab_masks.py --lib $here/build/libhopper_mask.so --seqs 32768 \
  --masks docs16,docs256,window4096,bigbird --rounds 3 --reps 2 > "$out/ab_masks_32k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_32k.log"
say "A/B 32K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_32k.log" >> "$out/summary.txt"
grep -E "check_vs_flex|Error|error|A/B rc" "$out/ab_masks_32k.log" | head -n 12 >> "$out/summary.txt"
waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 60 ]; do sleep 2; waited=$((waited + 2)); done
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
if [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (cd build-gpu && timeout 90 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
l=$(left); [ $l -gt 20 ] && timeout $l python3 $here/ab_masks.py --lib $here/build/libhopper_mask.so --seqs 131072 \
  --masks docs16,docs256,window4096,bigbird --rounds 2 --reps 1 > "$out/ab_masks_128k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_128k.log"
say "A/B 128K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_128k.log" >> "$out/summary.txt"
say "end"
