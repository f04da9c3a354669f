#!/usr/bin/env bash
# One call on 1 GPU (session t, 2026-11-29), issues 34 and 36: the GPU tests of what session t
# changed in the library. test_backends (every backend against the fp64 oracle, 4 shards at once;
# with HopperBackend.ClusterForwardMeetsTheRuleAt16K, the forward's 2-CTA cluster kernel through
# the backend, routed from 8K keys at D = 128 by 93c23dc, and both backward kernels' dQ stores,
# d43198e) and test_model_cuda (the tuned cuBLASLt products' bits, the LM head's vector loss
# kernel); then test_gpu_attention with the time left.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-220}
source bench/device_calls/call_start.sh 16 "test_backends test_model_cuda test_gpu_attention"
counts() { echo "$(cat "$@" | grep -c '^\[       OK') ok, $(cat "$@" | grep -c '^\[  FAILED  \]') failed lines, $(cat "$@" | grep -c '^\[  SKIPPED') skipped"; }
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=4 timeout 90 ./build-gpu/tests/test_backends > "$out/test_backends_$i.log" 2>&1 &
done
wait
say "test_backends (4 shards): $(counts "$out"/test_backends_*.log)"
grep -h '^\[  FAILED  \]\|Failure\|Which is\|max error' "$out"/test_backends_*.log | head -12 >> "$out/summary.txt"
grep -h 'ClusterForward' "$out"/test_backends_*.log | head -3 >> "$out/summary.txt"
OMP_NUM_THREADS=16 timeout 30 ./build-gpu/tests/test_model_cuda > "$out/test_model_cuda.log" 2>&1
say "test_model_cuda rc $?: $(counts "$out/test_model_cuda.log")"
l=$(left); [ $l -gt 30 ] && { OMP_NUM_THREADS=16 timeout $((l - 10)) ./build-gpu/tests/test_gpu_attention > "$out/test_gpu_attention.log" 2>&1
  say "test_gpu_attention rc $?: $(counts "$out/test_gpu_attention.log")"; }
say end
PACK_GLOBS="*.log" pack
