#!/usr/bin/env bash
# run_fwd_head_chunks.sh: session w's query heads in step for the cluster forward's tile pairs
# (FwdParams::head_chunk; lab variants cluster192c4 / c8 / c32: 4, 8 or all 32 heads' pair j before
# pair j + 1), from the repository root on an H200 with torch; carry ["dev/hopper_attention/build/w8"]
# (hopper_fwd_test and libhopper_fwd.so, built here with build.sh fwd, stripped). Steps: the dense
# D = 128 checks (fp64 oracle, bf16 rule; full grid and one cluster) of c8 and c32; only if they
# pass, ab_compare.py (interleaved with cuDNN): causal 8K and 16K, 32:32 and 32:8, and full 8K.
set -u
out=${OUT:-out_head_chunks}
source dev/hopper_attention/lab_call.sh
bd=${BUILD:-$here/build/w8}; chmod +x $bd/hopper_fwd_test
for v in cluster192c8 cluster192c32; do
  timeout 60 $bd/hopper_fwd_test check $v 128 dense >> "$out/checks.log" 2>&1 || echo "CHECK-FAILED $v rc=$?" >> "$out/checks.log"
done
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log"; then say "no timing"; exit 1; fi
ab() {
  timeout 120 python3 $here/ab_compare.py --lib $bd/libhopper_fwd.so "$@" >> "$out/ab.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab.log"
}
ab --seqs 8192,16384 --causal 1 --kv-heads 32,8 --variants cluster192,cluster192c4,cluster192c8,cluster192c32 --rounds 6 --reps 3 --check-rows 64
ab --seqs 8192 --causal 0 --kv-heads 32 --variants cluster192,cluster192c8,cluster192c32 --rounds 6 --reps 3 --check-rows 64
say "A/B:"; grep -E "^AB |A/B rc|Error|CHECKBIG.*(SUSPECT|bad)" "$out/ab.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
grep -c "CHECKBIG.* ok" "$out/ab.log" | sed 's/^/CHECKBIG ok lines: /' >> "$out/summary.txt"
say end
