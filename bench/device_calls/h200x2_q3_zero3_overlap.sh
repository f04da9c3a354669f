#!/usr/bin/env bash
# One call on 2 GPUs (session q, 2026-11-28), issue 36: ZeRO-3's overlap (d3bc9e1: the next unit's
# all-gather and each gradient's reduce-scatter on a second stream under the compute)
#  1. build; ModelCuda.* (the layer kernels, the vectorised casts of 5fc3a9a); the GPU training tests
#     of ZeRO (the new Zero3OverlapGivesTheBitsOfTheCollectivesInLine
#     over NCCL on the two GPUs, and the ZeRO / resume ones)
#  2. the 8B preset at 64K on both GPUs, ZeRO-3, --profile: in line (--no-zero-overlap), overlapped,
#     in line again where time is left (session m: 45.1% MFU, 'between ops' 352 ms of a 7,325 ms step)
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 32 "seqpar_cli test_gpu_train test_model_cuda"
timeout 60 ./build-gpu/tests/test_model_cuda > "$out/model_cuda.log" 2>&1
say "model cuda rc $?: $(grep -c '^\[       OK' "$out/model_cuda.log") ok, $(grep -c '^\[  FAILED  \]' "$out/model_cuda.log") failed lines"
timeout 120 ./build-gpu/tests/test_gpu_train \
  --gtest_filter='GpuTrain.Zero3*:GpuTrain.DataParallelAndZero*:GpuTrain.UntiedHead*:GpuTrain.RunsRepeat*' \
  > "$out/gpu_train_zero.log" 2>&1
say "gpu train zero rc $?: $(grep -E '^\[       OK|^\[  FAILED  \]|^\[  SKIPPED' "$out/gpu_train_zero.log" | sort | uniq | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train8b() {  # tag [flags]
  local l=$(left); [ $l -lt 100 ] && { say "out of time before 8B $1"; return 9; }
  timeout $(( l - 10 < 150 ? l - 10 : 150 )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 8b --zero 3 \
    --data "text:$txt" --seq 65536 --batch 1 --steps 4 --warmup 10 --lr 3e-5 --checkpointing attention --profile --json ${2:-} \
    > "$out/train_8b_64k_$1.jsonl" 2> "$out/train_8b_64k_$1.err"
  say "8B 64K $1 rc $? $(grep -m1 -i 'error' "$out/train_8b_64k_$1.err")"
  python3 bench/device_calls/train_summary.py "$out/train_8b_64k_$1.jsonl" "$1" between_ops pass step | tee -a "$out/summary.txt"
}
train8b in_line --no-zero-overlap
train8b overlap
train8b in_line2 --no-zero-overlap
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
