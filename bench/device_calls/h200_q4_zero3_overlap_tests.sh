#!/usr/bin/env bash
# One call on 1 GPU (session q, 2026-11-28; no 2-GPU kind was lent): ZeRO-3's overlap (d3bc9e1) on a
# GPU for the first time, over thread ranks sharing it (the local communicator is host-driven,
# so the lane's collectives complete in turn; the NCCL path needs h200x2_q3_zero3_overlap.sh):
# the ZeRO tests of test_gpu_train first, then the rest of it in the time left.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-330}
source bench/device_calls/call_start.sh 16 "test_gpu_train"
zero='GpuTrain.Zero3*:GpuTrain.DataParallelAndZero*:GpuTrain.UntiedHead*:GpuTrain.RunsRepeat*'
timeout 120 ./build-gpu/tests/test_gpu_train --gtest_filter="$zero" > "$out/gpu_train_zero.log" 2>&1
say "gpu train zero rc $?: $(grep -E '^\[       OK|^\[  FAILED  \]|^\[  SKIPPED' "$out/gpu_train_zero.log" | sort | uniq | tr '\n' ' ')"
l=$(left); [ $l -gt 40 ] && { timeout $(( l - 15 )) ./build-gpu/tests/test_gpu_train --gtest_filter="-$zero" > "$out/gpu_train_rest.log" 2>&1
  say "gpu train rest rc $?: $(grep -c '^\[       OK' "$out/gpu_train_rest.log") ok, $(grep -c '^\[  FAILED  \]' "$out/gpu_train_rest.log") failed lines, $(grep -c '^\[  SKIPPED' "$out/gpu_train_rest.log") skipped"; }
say end
PACK_GLOBS="*.log" pack
