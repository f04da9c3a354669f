#!/usr/bin/env bash
# One call on 1 GPU (session r, 2026-11-29), issue 34: the GPU suite after the D = 128 backward's
# 80-row tiles (q80: dense in 9a8aab4, tile lists after it) and the D = 64 forward's unit order
# (3ada4a3): every backend against the fp64 oracle (test_backends), the GPU attention tests, and
# every schedule on P thread ranks of the one GPU (test_gpu_schedules; its NCCL cases need two
# GPUs and skip), each capped by the call's time left.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-330}
source bench/device_calls/call_start.sh 16 "test_backends test_gpu_attention test_gpu_schedules"
suite() {  # name cap
  local l=$(left); [ $l -lt 20 ] && { say "out of time before $1"; return 9; }
  OMP_NUM_THREADS=16 timeout $(( l - 10 < $2 ? l - 10 : $2 )) ./build-gpu/tests/$1 > "$out/$1.log" 2>&1
  say "$1 rc $?: $(grep -c '^\[       OK' "$out/$1.log") ok, $(grep -c '^\[  FAILED  \]' "$out/$1.log") failed lines, $(grep -c '^\[  SKIPPED' "$out/$1.log") skipped; $(grep -E '^\[  (PASSED|FAILED)' "$out/$1.log" | head -2 | tr '\n' ' ')"
  grep '^\[  FAILED  \]' "$out/$1.log" | head -10 >> "$out/summary.txt"
}
suite test_backends 60
suite test_gpu_attention 60
suite test_gpu_schedules 400
say end
PACK_GLOBS="*.log" pack
