#!/usr/bin/env bash
# One call on 4 GPUs (session i, 2026-11-27; warm after h100x4_documents_and_causal.sh, same snapshot and build): issue 37's GPU test of
# the documents layout in training, then issue 39's tnl-1b with LASP: tokens/s, MFU and device
# peak on 4 GPUs (ZeRO-3) at growing lengths until one fails, then 2 GPUs, then 1 GPU at 128K.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-570}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
BUILD_JOBS=64 BUILD_TARGETS="seqpar_cli test_gpu_train test_gpu_lasp" timeout 200 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
say "build rc $?"
source scripts/gpu_env.sh
OMP_NUM_THREADS=8 timeout 120 ./build-gpu/tests/test_gpu_train --gtest_filter="${TESTS:-GpuTrain.PackedDocuments*:GpuTrain.LinearAttentionUlysses*}" > "$out/gpu_train.log" 2>&1
say "gpu_train rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure|error' "$out/gpu_train.log" | head -5 | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in $(seq 1 24); do cat README.md docs/*.md; done > $txt
train() {  # gpus seq tag [extra...]
  local g=$1 S=$2 tag=$3; shift 3
  local l=$(left); [ $l -lt 45 ] && { say "out of time before $tag"; return 9; }
  timeout $l ./build-gpu/seqpar train --device cuda --gpus $g --model tnl-1b --data "text:$txt" --seq $S --batch 1 \
    --steps 3 --warmup 1 --checkpointing ${CK:-attention} --json "$@" > "$out/$tag.jsonl" 2> "$out/$tag.err"
  local rc=$?; say "$tag rc $rc $(tail -n 1 "$out/$tag.jsonl" | head -c 330) $(grep -m1 -i 'error' "$out/$tag.err")"
  return $rc
}
OMP_NUM_THREADS=8 timeout 90 ./build-gpu/tests/test_gpu_lasp > "$out/gpu_lasp.log" 2>&1
say "gpu_lasp rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_lasp.log" | head -5 | tr '\n' ' ')"
# LASP (the chain) against the paper's baseline (ulysses: all-to-all to head parts around the
# whole-sequence kernel), same lengths, ZeRO-3, checkpointing; then without checkpointing at 128K.
for S in 262144 524288; do
  for sp in lasp ulysses; do train 4 $S tnl1b_4gpu_${sp}_$S --zero 3 --linear-sp $sp; done
done
for sp in lasp ulysses; do CK=none train 4 131072 tnl1b_4gpu_${sp}_131072_nockpt --zero 3 --linear-sp $sp; done
for S in 786432 1048576; do train 4 $S tnl1b_4gpu_lasp_$S --zero 3 --linear-sp lasp || break; done
train 2 262144 tnl1b_2gpu_lasp_262144 --zero 3 --linear-sp lasp
train 1 131072 tnl1b_1gpu_131072
say end
cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err
