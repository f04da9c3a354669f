#!/usr/bin/env bash
# run_listed_heads_inner.sh: session w's heads-inner order on the backward's tile lists (BwdParams::
# heads_inner: CTA lin takes the lists' rank lin / heads of head lin % heads, in place of
# listed_unit's outliers-first, heads-outer order; lab variants baseh and q80h), from the
# repository root on an H200 with torch; carry ["dev/hopper_attention/build/w10"] (hopper_bwd_test
# and libhopper_mask.so, built here with build.sh bwd and mask, stripped). Steps: the masked
# D = 128 checks of base, baseh, q80, q80h (fp64 oracle, bf16 rule); only if they pass, ab_masks.py
# --fb-all at 8K (16 documents and BigBird on base's lists, the 4K window on q80's), the backward
# alone and after each forward, against compiled flex.
set -u
out=${OUT:-out_listed_inner}; BUDGET=${BUDGET:-200}
source dev/hopper_attention/lab_call.sh
bd=${BUILD:-$here/build/w10}; chmod +x $bd/hopper_bwd_test
timeout 60 $bd/hopper_bwd_test check 128 base,baseh,q80,q80h masks > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log" || ! grep -q 'cases pass' "$out/checks.log"; then say "no timing"; exit 1; fi
timeout $(( $(left) - 5 )) python3 $here/ab_masks.py --lib $bd/libhopper_mask.so --fwd persist192 --fwd-causal cluster192 \
  --fwd-variants persist64 --bwd-variants base,baseh,q80,q80h --causal-ref q80 --fb-all --skip-causal \
  --seqs 8192 --masks ${MASKS:-docs16,bigbird,window4096} --rounds 3 --reps 2 > "$out/ab_8k.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_8k.log"
say "A/B:"; sed -n '/^SUMMARY per backward/,$p' "$out/ab_8k.log" >> "$out/summary.txt"
grep -E "Error|error|A/B rc" "$out/ab_8k.log" | head -n 8 >> "$out/summary.txt"
say end
