#!/usr/bin/env bash
# One call on 1 GPU (session w, 2026-11-29), issue 34: test_backends in 4 shards on the library as
# routed by session w (the cluster forward under the causal mask from 8K to 128K keys; the dense
# D = 128 backward's key tiles with the K/V heads inner under the causal mask up to 16K keys), every
# step kind under the bf16 rule against the fp64 oracle; then the lab's D = 64 question (carried
# dev/hopper_attention/build/w5, built here with build.sh bwd): the q128 checks with heads inner
# (q128h) and ab_bwd.py q128 / q128h / cuDNN at 8K and 16K, full and causal, 32:32 and 32:8.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 16 "test_backends"
shards test_backends 4 110
lab=$root/dev/hopper_attention; bd=$lab/build/w5; chmod +x $bd/hopper_bwd_test
timeout 60 $bd/hopper_bwd_test check 64 q128,q128h dense > "$out/checks64.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks64.log"
say "D = 64 checks: $(grep -c '^PASS' $out/checks64.log) PASS, $(grep -c '^FAIL' $out/checks64.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks64.log | tr '\n' ';')"
if ! grep -qE '^FAIL|CHECK-FAILED' "$out/checks64.log" && [ $(left) -gt 40 ]; then
  timeout $(( $(left) - 10 )) python3 $lab/ab_bwd.py --fwd-lib $bd/libhopper_fwd.so --bwd-lib $bd/libhopper_bwd.so --dim 64 \
    --seqs 8192,16384 --kv-heads 32,8 --variants q128,q128h --rounds 4 --reps 2 > "$out/ab_bwd64.log" 2>&1 || echo "rc=$?" >> "$out/ab_bwd64.log"
  say "D = 64 backward (ab_bwd.py):"; grep -E "^ABBWD|SUSPECT|rc=|rror" "$out/ab_bwd64.log" | sed -E 's/ \(min [0-9.]* max [0-9.]*\)//' >> "$out/summary.txt"
fi
say end
