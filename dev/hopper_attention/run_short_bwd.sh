#!/usr/bin/env bash
# run_short_bwd.sh: the one-call GPU script of the short-tile backward (short64:
# src/kernels/hopper/hopper_bwd_short.cuh, 64-key tiles, one consumer, two CTAs per SM; README
# section "Backward on 64-key tiles for short lists (session u)"), from the repository root on an
# H200 with torch; carry ["dev/hopper_attention/build/bshort"] (built here with build.sh bwd and
# mask, copied there, the .so stripped). Steps, each capped, in the order they matter:
#   1. the lab's checks: hopper_bwd_test check 128 short64,base all (the 12 dense D = 128 cases and
#      the 10 masked ones: documents with 1-token ones, docs:7 with B = 2 and GQA 4:2, windows with
#      rows that see no key, BigBird, an accumulating backward; fp64 oracle, bf16 rule, NaN-poisoned
#      outputs; both variants on the same inputs); the CTAs per SM short64's launcher found;
#   2. only if every check passes: standalone benchmask, 256 documents at 32K, base / short64 /
#      short64 / base (the whole backward after our forward);
#   3. ab_masks.py at 32K (docs256, docs64, window512, bigbird, then docs16, window4096) with
#      --fb-all: backward alone base and short64, each after persist64's forward (fwd+bwd) and after
#      persist192's, compiled flex on the same mask, dense causal against cuDNN, O and gradients
#      compared with flex's over every element;
#   4. ab_masks.py at 128K, docs256 (no dense causal).
# Logs in $OUT; ab_masks.py prints one JSON line per mask, so a step cut by its cap keeps its
# finished masks. CHECK_VARIANTS, BENCH_VARIANTS (hopper_bwd_test's variant numbers) and
# BWD_VARIANTS change the backwards compared (session u's second call: base, sfirst and short64).
set -u
out=${OUT:-out_sbwd}; BUDGET=${BUDGET:-215}
source dev/hopper_attention/lab_call.sh
say "rev $(git rev-parse --short HEAD 2>/dev/null) + working tree"
here=dev/hopper_attention; bd=$here/build/bshort; bwd=$bd/hopper_bwd_test; lib=$bd/libhopper_mask.so
chmod +x $bwd 2>/dev/null
if ! "$bwd" 2>&1 | grep -qi usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: stop"; say "end"; exit 1
fi
LAB_SHORT_OCCUPANCY=1 timeout 45 $bwd check 128 ${CHECK_VARIANTS:-short64,base} all > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED|CTAs per SM' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log" || ! grep -q 'cases pass' "$out/checks.log"; then
  grep -E '^FAIL|CHECK-FAILED|error' "$out/checks.log" | head -n 12 >> "$out/summary.txt"
  say "checks failed: no timing"; say "end"; exit 1
fi
for v in ${BENCH_VARIANTS:-0 6 6 0}; do
  timeout 20 $bwd benchmask 32768 docs:256 32 32 128 20 $v 2>&1 | grep -E "BENCH|rror" >> "$out/bench.log"
done
say "standalone (variant 0 base, 3 sfirst, 6 short64):"; sed -E 's/ \(min [0-9.]* max [0-9.]*\)//' "$out/bench.log" >> "$out/summary.txt"
ab() {  # ab <log> <cap> <args...>
  local log=$1 cap=$2; shift 2
  local l=$(left); if [ $l -lt 25 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  timeout $cap python3 $here/ab_masks.py --lib $lib --fwd persist192 --fwd-causal persist192u --fwd-variants persist64 \
    --bwd-variants ${BWD_VARIANTS:-base,short64} --causal-ref base --fb-all "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($*):"; sed -n '/^SUMMARY per backward/,$p' "$out/$log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error|A/B rc" "$out/$log" | head -n 24 >> "$out/summary.txt"
}
ab ab_32k.log 135 --seqs 32768 --masks ${MASKS32:-docs256,docs64,window512,bigbird,docs16,window4096} --rounds 3 --reps 2
ab ab_128k.log 60 --seqs 131072 --masks ${MASKS128:-docs256} --rounds 2 --reps 2 --skip-causal
say "end"
