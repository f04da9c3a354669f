#!/usr/bin/env bash
# One call on one GPU (session i, 2026-11-27): the linear-attention GPU test (never run before), test_backends
# (commit 4342b6c), then tnl-1b on one GPU: tokens/s and device peak at growing lengths until
# one fails (the longest trainable sequence on 1 GPU; issue 39 asks for 512K).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=60
root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry
start=$SECONDS
say() { echo "[$((SECONDS - start))s] $*" | tee -a $OUT/summary.txt; }
nvidia-smi -L | tee $OUT/summary.txt
BUILD_JOBS=32 BUILD_TARGETS="seqpar_cli test_gpu_train test_backends" timeout 330 bash scripts/gpu_check.sh build > $OUT/build.log 2>&1 || tail -n 40 $OUT/build.log
say "built"
OMP_NUM_THREADS=8 timeout 150 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.LinearAttentionModelsFollowTheCpuRun:GpuTrain.RefusesWhatItCannotDo' > $OUT/gpu_train.log 2>&1
say "gpu_train rc $? $(grep -E 'PASSED|FAILED' $OUT/gpu_train.log | tr '\n' ' ')"
OMP_NUM_THREADS=8 timeout 120 ./build-gpu/tests/test_backends > $OUT/backends.log 2>&1
say "backends rc $? $(grep -E '^\[  (PASSED|FAILED)' $OUT/backends.log | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do cat README.md docs/*.md; done > $txt
for S in 65536 262144 524288 1048576; do
  left=$((560 - (SECONDS - start))); [ $left -lt 40 ] && { say "out of time before $S"; break; }
  timeout $left ./build-gpu/seqpar train --device cuda --model tnl-1b --data "text:$txt" --seq $S --batch 1 --steps 3 \
    --warmup 1 --checkpointing attention --json >> $OUT/tnl1b_1gpu.jsonl 2> $OUT/tnl1b_$S.err
  rc=$?; say "tnl-1b $S rc $rc $(tail -n 1 $OUT/tnl1b_1gpu.jsonl | head -c 400) $(tail -n 2 $OUT/tnl1b_$S.err)"
  [ $rc -ne 0 ] && break
done
say end
