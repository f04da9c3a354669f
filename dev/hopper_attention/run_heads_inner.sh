#!/usr/bin/env bash
# run_heads_inner.sh: session w's unit order for the dense backward (q80h: the grid's key tiles
# heaviest first with the K/V heads inner, BwdParams::heads_inner) and the cluster forward at 128K
# causal, from the repository root on an H200 with torch; carry ["dev/hopper_attention/build/w4"]
# (hopper_bwd_test, libhopper_bwd.so, libhopper_fwd.so, built here with build.sh fwd and bwd,
# stripped). Steps: the dense D = 128 checks of q80 and q80h (fp64 oracle, bf16 rule); only if they
# pass, ab_bwd.py (q80, q80h and cuDNN interleaved, full and causal, 32:32 and 32:8, 8K-32K); then
# ab_compare.py at 128K causal (persist192u, the backend's, against cluster192, routed to 64K).
set -u
out=${OUT:-out_heads_inner}
source dev/hopper_attention/lab_call.sh
bd=${BUILD:-$here/build/w4}; chmod +x $bd/hopper_bwd_test
timeout 90 $bd/hopper_bwd_test check 128 q80,q80h dense > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log" || ! grep -q 'cases pass' "$out/checks.log"; then
  grep -E '^FAIL|CHECK-FAILED|rror' "$out/checks.log" | head -n 12 >> "$out/summary.txt"; say "no timing"; exit 1
fi
timeout ${BWD_CAP:-240} python3 $here/ab_bwd.py --fwd-lib $bd/libhopper_fwd.so --bwd-lib $bd/libhopper_bwd.so \
  --seqs ${SEQS:-8192,16384,32768} --kv-heads 32,8 --variants q80,q80h --rounds ${ROUNDS:-4} --reps 2 > "$out/ab_bwd.log" 2>&1 \
  || echo "rc=$?" >> "$out/ab_bwd.log"
say "backward (ab_bwd.py):"; grep -E "^AB|SUSPECT|rc=|rror" "$out/ab_bwd.log" | sed -E 's/ \(min [0-9.]* max [0-9.]*\)//' >> "$out/summary.txt"
timeout 100 python3 $here/ab_compare.py --lib $bd/libhopper_fwd.so --seqs 131072 --variants persist192u,cluster192 \
  --kv-heads 32,8 --causal 1 --rounds 3 --reps 1 --check-rows 64 > "$out/fwd_128k.log" 2>&1 || echo "rc=$?" >> "$out/fwd_128k.log"
say "forward 128K causal:"; grep -E "^AB|CHECKBIG|rc=" "$out/fwd_128k.log" >> "$out/summary.txt"
say end
