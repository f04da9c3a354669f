#!/usr/bin/env bash
# One call on 1 GPU (session q, 2026-11-28), issue 36: the GPU RoPE and SwiGLU kernels of 6f4f580
#  1. build; ModelCuda.* (the layer kernels against their fp64 versions) and test_gpu_train
#  2. the 1B preset at 32K tokens on the GPU (the tokens a GPU of the 2-GPU 64K runs), --profile:
#     new kernels, the previous ones (.carry/old_kernels: rope.cu and swiglu.cu of 6f4f580^, built
#     into the same tree), new again; the step's time by kind for each
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-400}
source bench/device_calls/call_start.sh 16 "seqpar_cli test_model_cuda test_gpu_train"
timeout 60 ./build-gpu/tests/test_model_cuda > "$out/model_cuda.log" 2>&1
say "model cuda rc $?: $(grep -c '^\[       OK' "$out/model_cuda.log") ok, $(grep -c '^\[  FAILED  \]' "$out/model_cuda.log") failed lines"
timeout 90 ./build-gpu/tests/test_gpu_train > "$out/gpu_train.log" 2>&1
say "gpu train rc $?: $(grep -c '^\[       OK' "$out/gpu_train.log") ok, $(grep -c '^\[  FAILED  \]' "$out/gpu_train.log") failed lines, $(grep -c '^\[  SKIPPED' "$out/gpu_train.log") skipped"
train_text
KINDS="rope swiglu norms attention products step"
swap() {  # the kernel files from $1, rebuilt
  cp "$1/rope.cu" src/model/rope.cu && cp "$1/swiglu.cu" src/model/swiglu.cu
  timeout 120 cmake --build build-gpu --target seqpar_cli -j 16 > "$out/rebuild_$2.log" 2>&1; say "rebuild $2 rc $?"
}
mkdir -p /tmp/new_kernels && cp src/model/rope.cu src/model/swiglu.cu /tmp/new_kernels/
train1b 32k_new 32768 4 --checkpointing attention
swap .carry/old_kernels old && train1b 32k_old 32768 4 --checkpointing attention
swap /tmp/new_kernels new2 && train1b 32k_new2 32768 4 --checkpointing attention
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
