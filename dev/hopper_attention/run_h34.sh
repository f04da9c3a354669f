#!/usr/bin/env bash
# run_h34.sh: one-call GPU script for issue 34's backward fixed cost (README "Backward: the fixed
# cost"): the library's test_backends in the background; the lab's build and checks (backward
# dense + masked at D = 128 and 64, forward masked cases); the whole backward per prologue variant
# (memset, base, sfirst; bench also times the rest without the main kernel) at 8K-128K and for
# masks; ab_bwd.py (the variants vs cuDNN, interleaved); ab_masks.py at 32K (AB_MASKS=0 skips);
# the backend's ctest cases. From the repository root (or a snapshot of it) on an H100 with
# .carry's deps; logs in $OUT (8 files). Variables: SEQS (bench lengths), AB_SEQS, AB64_SEQS.
set -u
out=${OUT:-out_h34}; t0=$(date +%s)
SEQS=${SEQS:-"8192 32768 131072"}
AB_SEQS=${AB_SEQS:-"8192,16384,32768"}
AB64_SEQS=${AB64_SEQS-"8192,16384"}
source dev/hopper_attention/lab_start.sh
{
  timeout 60 $bwd check 128 base all || echo "CHECK-FAILED bwd 128 base"
  timeout 60 $bwd check 64 base all || echo "CHECK-FAILED bwd 64 base"
  timeout 30 $bwd check 128 memset dense || echo "CHECK-FAILED bwd 128 memset"
  timeout 30 $bwd check 128 sfirst dense || echo "CHECK-FAILED bwd 128 sfirst"
  timeout 30 $bwd check 64 sfirst dense || echo "CHECK-FAILED bwd 64 sfirst"
  timeout 60 $fwd check pp192 128 masks || echo "CHECK-FAILED fwd pp192 masks"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
# The whole backward per variant (2 memset, 0 base, 3 sfirst), in the order 2 0 3 3 0 2 so that a
# drift in clocks does not favour one.
{
  for S in $SEQS; do
    r=5; [ $S -ge 131072 ] && r=3
    for v in 2 0 3 3 0 2; do timeout 60 $bwd bench $S 1 32 32 128 $r $v || echo "BENCH-FAILED $S $v"; done
  done
  for v in 2 0 3 3 0 2; do
    timeout 30 $bwd bench 8192 0 32 32 128 5 $v
    timeout 30 $bwd bench 32768 1 32 8 128 5 $v
    timeout 30 $bwd bench 32768 1 32 32 64 5 $v
    for m in docs:256 docs:16 bigbird:128; do timeout 30 $bwd benchmask 32768 $m 32 32 128 5 $v; done
  done
  # Nsight Compute (issue 34 item 3: what costs most at 32K dense): the forward (pp192) and the
  # backward's main kernel, causal, one launch each.
  if command -v ncu >/dev/null && [ "${NCU:-1}" = 1 ]; then
    timeout 90 ncu -k regex:fwd_kernel -c 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
      $fwd bench pp192 32768 1 32 32 128 1 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU fwd /" | tail -n 60
    timeout 120 ncu -k regex:bwd_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
      $bwd bench 16384 1 32 32 128 1 0 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU bwd /" | tail -n 50
  fi
} > "$out/bench.log" 2>&1
say "benches done"; grep -E "^BENCH bwd variant=[0-9] S=[0-9]+ causal=[01] H|^BENCHMASK|BENCH-FAILED" "$out/bench.log" | sed 's/ (min [0-9.]* max [0-9.]*)//; s/visible=.*boundary=[0-9]* //' >> "$out/summary.txt"
{
  timeout 150 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so --bwd-lib $here/build/libhopper_bwd.so \
    --seqs "$AB_SEQS" --kv-heads 32,8 --dim 128 --variants memset,base,sfirst
  [ -n "$AB64_SEQS" ] && timeout 60 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so \
    --bwd-lib $here/build/libhopper_bwd.so --seqs "$AB64_SEQS" --kv-heads 32 --dim 64 --variants memset,base,sfirst
} > "$out/ab_bwd.log" 2>&1
say "A/B:"; grep -E "^SUMMARY|SUSPECT|Error" "$out/ab_bwd.log" >> "$out/summary.txt"
if [ "${AB_MASKS:-1}" = 1 ]; then
  timeout 120 python3 $here/ab_masks.py --lib $here/build/libhopper_mask.so --seqs 32768 \
    --masks docs16,docs256,window4096,bigbird --rounds 3 --reps 2 > "$out/ab_masks_32k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_masks_32k.log"
  say "A/B masks 32K:"; sed -n '/^SUMMARY/,$p' "$out/ab_masks_32k.log" >> "$out/summary.txt"
fi
waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 90 ]; do sleep 2; waited=$((waited + 2)); done
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
if [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (cd build-gpu && timeout 90 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
say "end"
