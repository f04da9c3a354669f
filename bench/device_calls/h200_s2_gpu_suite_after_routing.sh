#!/usr/bin/env bash
# One call on 1 GPU (session s, 2026-11-29), issue 34: the GPU suite after the per-mask backward
# choice (2ad0cea: D = 128 tile lists on q80 or base by tall_tiles_pay), the 80-row dQ conversion
# (1b0c8b6) and the bf16 dO / da of training (fbb44f1): every backend against the fp64 oracle
# (test_backends, in 4 shards at once: one process outran 60 s in a helper's call), every
# schedule on P thread ranks of the one GPU under the bf16 rule (test_gpu_schedules; its NCCL
# cases need two GPUs and skip), the GPU attention tests, each capped by the call's time left.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-300}
source bench/device_calls/call_start.sh 16 "test_backends test_gpu_attention test_gpu_schedules"
counts() { echo "$(cat "$@" | grep -c '^\[       OK') ok, $(cat "$@" | grep -c '^\[  FAILED  \]') failed lines, $(cat "$@" | grep -c '^\[  SKIPPED') skipped"; }
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=4 timeout 90 ./build-gpu/tests/test_backends > "$out/test_backends_$i.log" 2>&1 &
done
wait
say "test_backends (4 shards): $(counts "$out"/test_backends_*.log)"
grep -h '^\[  FAILED  \]' "$out"/test_backends_*.log | head -10 >> "$out/summary.txt"
suite() {  # name cap
  local l=$(left); [ $l -lt 20 ] && { say "out of time before $1"; return 9; }
  OMP_NUM_THREADS=16 timeout $(( l - 10 < $2 ? l - 10 : $2 )) ./build-gpu/tests/$1 > "$out/$1.log" 2>&1
  say "$1 rc $?: $(counts "$out/$1.log"); $(grep -E '^\[  (PASSED|FAILED)' "$out/$1.log" | head -2 | tr '\n' ' ')"
  grep '^\[  FAILED  \]' "$out/$1.log" | head -10 >> "$out/summary.txt"
}
suite test_gpu_schedules 150
suite test_gpu_attention 400
say end
PACK_GLOBS="*.log" pack
