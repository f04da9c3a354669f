#!/usr/bin/env bash
# One short call on 2 GPUs (session n, 2026-11-28): the whole GPU schedule suite (every schedule
# against the fp64 oracle, P thread ranks on one GPU), sharded over the two GPUs, after the own
# query pack's fix (b7052a6; call n1 ran 77 of its 106 cases before its cap) and the Hopper
# forward's uniform descriptors (d2980a7).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-230}
source bench/device_calls/call_start.sh 32 "test_gpu_schedules"
for g in 0 1; do
  ( CUDA_VISIBLE_DEVICES=$g GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$g OMP_NUM_THREADS=8 \
      timeout $(( $(left) - 10 )) ./build-gpu/tests/test_gpu_schedules > "$out/gpu_schedules_$g.log" 2>&1 ) &
done
wait
for g in 0 1; do
  say "shard $g: $(grep -c '^\[       OK' "$out/gpu_schedules_$g.log") ok, $(grep -c '^\[  FAILED  \]' "$out/gpu_schedules_$g.log") failed lines; $(grep -E '^\[  (PASSED|FAILED)|tests ran' "$out/gpu_schedules_$g.log" | head -3 | tr '\n' ' ')"
done
say end
pack
