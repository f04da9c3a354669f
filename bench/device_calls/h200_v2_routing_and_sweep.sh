#!/usr/bin/env bash
# One call on 1 GPU (session v, 2026-11-29), issue 34: test_backends in 4 shards on the library
# as routed now (short64 on lists of 64 x 64 tiles, q80 on lists where it computes at most 3% more
# query rows, the preprocessing through O's and dO's strides), every step kind under the bf16 rule
# against the fp64 oracle; then the lab's mask sweep (dev/hopper_attention/run_mask_sweep.sh) at the
# lengths session v's first sweep call did not reach, 16K and 64K: the backend's pair per mask
# against compiled flex and our dense causal (carried dev/hopper_attention/build/v3/libhopper_mask.so,
# built here with build.sh mask).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-540}
source bench/device_calls/call_start.sh 16 "test_backends"
shards test_backends 4 110
l=$(left)
OUT=$out/sweep BUDGET=$((l - 10)) LIB=$root/dev/hopper_attention/build/v3/libhopper_mask.so SEQS="${SWEEP_SEQS:-16384 65536}" \
  bash dev/hopper_attention/run_mask_sweep.sh > /dev/null 2>&1
cat $out/sweep/summary.txt >> $out/summary.txt
say end
