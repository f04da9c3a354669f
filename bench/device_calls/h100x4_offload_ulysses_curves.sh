#!/usr/bin/env bash
# One call on 4 GPUs (session i, 2026-11-28, the last; it ran past its 524 s limit during the 1M offload run, so only 8 files came back: keep $OUT small): the helpers' changes on the GPU, then
#  1. tests: checkpoint offload bit-for-bit, the Ulysses baseline, LASP on device tensors
#  2. tnl-1b: LASP with --offload-checkpoints at growing lengths on 4 GPUs (ZeRO-3) and on 1;
#     the Ulysses baseline (now keeping nothing per layer) at 256K and 512K
#  3. documents: auto (the planner now sees the documents layout) against ring-return and
#     ulysses, interleaved rounds, 256K and 512K
#  4. 200-step loss curves of tnl-1b at 8K tokens: 1 GPU, 4 GPUs, and 2 thread ranks sharing
#     GPU 0 (the yardstick: only the reduction order changes)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-575}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
BUILD_JOBS=64 BUILD_TARGETS="seqpar_cli test_gpu_train test_gpu_lasp bench_gpu_ring" timeout 280 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; exit 1; }
OMP_NUM_THREADS=8 timeout 150 ./build-gpu/tests/test_gpu_train --gtest_filter="${TESTS:-GpuTrain.Offload*:GpuTrain.LinearAttention*:GpuTrain.PackedDocuments*:GpuTrain.RefusesWhatItCannotDo}" > "$out/gpu_train.log" 2>&1
say "gpu_train rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_train.log" | head -6 | tr '\n' ' ')"
OMP_NUM_THREADS=8 timeout 60 ./build-gpu/tests/test_gpu_lasp > "$out/gpu_lasp.log" 2>&1
say "gpu_lasp rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_lasp.log" | head -5 | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in $(seq 1 24); do cat README.md docs/*.md; done > $txt
train() {  # gpus seq tag [extra...]
  local g=$1 S=$2 tag=$3; shift 3
  local l=$(left); [ $l -lt 45 ] && { say "out of time before $tag"; return 9; }
  timeout $(( l < ${CAP:-120} ? l : ${CAP:-120} )) ./build-gpu/seqpar train --device cuda --gpus $g --model tnl-1b --data "text:$txt" --seq $S --batch 1 \
    --steps ${STEPS:-3} --warmup ${WARM:-1} --checkpointing ${CK:-attention} --json "$@" > "$out/$tag.jsonl" 2> "$out/$tag.err"
  local rc=$?; say "$tag rc $rc $(tail -n 1 "$out/$tag.jsonl" | head -c 330) $(grep -m1 -i 'error' "$out/$tag.err")"
  return $rc
}
for S in 262144 524288; do train 4 $S tnl1b_4gpu_ulysses_$S --zero 3 --linear-sp ulysses; done
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
l=$(left); timeout $(( l > 200 ? 90 : l / 3 )) ./build-gpu/bench_gpu_ring --seqs 262144,524288 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ring-return,ulysses,ulysses-ring --rounds 3 $common >> "$out/docs_rounds.jsonl" 2>> "$out/err.log"
say "docs rounds rc $?"
CAP=200 STEPS=200 WARM=20 train 1 8192 curve_1gpu --lr 3e-4
CAP=200 STEPS=200 WARM=20 train 4 8192 curve_4gpu --lr 3e-4 --linear-sp lasp
l=$(left); [ $l -gt 60 ] && { timeout $(( l < 150 ? l : 150 )) ./build-gpu/seqpar train --device cuda --ranks 2 --model tnl-1b --data "text:$txt" --seq 8192 --batch 1 \
  --steps 200 --warmup 20 --lr 3e-4 --checkpointing attention --json > "$out/curve_1gpu_2ranks.jsonl" 2> "$out/curve_1gpu_2ranks.err"; say "yardstick rc $?"; }
for S in 524288 786432 1048576 1572864; do train 4 $S tnl1b_4gpu_lasp_offload_$S --zero 3 --linear-sp lasp --offload-checkpoints || break; done
for S in 131072 262144; do train 1 $S tnl1b_1gpu_offload_$S --offload-checkpoints || break; done
say end
cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err
