#!/usr/bin/env bash
# One call on 4 GPUs (session k, 2026-11-28): the executor's batched copies and joins into the
# caller's tensors (issue 37's 256K documents), pinned offload slots by mmap + registration, and
# the tiled MLP's first GPU run (issue 39).
#  1. build; then four one-GPU jobs side by side (one GPU each): the small-kernel tests
#     (FlashSmallKernels.*, the new CopyMany among them) and test_gpu_schedules; test_gpu_train's
#     GpuTrain.* (the tiled MLP's test among them); tnl-1b at 256K and at 512K on one GPU with
#     --tile-tokens -1 and offloaded checkpoints (first step: pinning)
#  2. all four GPUs: lognormal documents (mean 8K) 256K-1M on the documents layout, and dense
#     causal 256K/512K, 2 interleaved rounds; a step trace of ulysses-overlap at 256K documents
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-k" && ln -sfn "$root/build-gpu-k" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-570}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err *.log); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring seqpar_cli test_gpu_train test_gpu_attention test_gpu_schedules" \
  timeout 280 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
tnl() {  # gpu seq tag
  CUDA_VISIBLE_DEVICES=$1 timeout 200 ./build-gpu/seqpar train --device cuda --gpus 1 --model tnl-1b --data "text:$txt" \
    --seq $2 --batch 1 --steps 3 --warmup 1 --checkpointing attention --offload-checkpoints --tile-tokens -1 --json \
    > "$out/$3.jsonl" 2> "$out/$3.err"
  echo "rc $?" >> "$out/$3.err"
}
( CUDA_VISIBLE_DEVICES=0 timeout 60 ./build-gpu/tests/test_gpu_attention --gtest_filter='FlashSmallKernels.*' > "$out/gpu_attention.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout 170 ./build-gpu/tests/test_gpu_schedules > "$out/gpu_schedules.log" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=4 timeout 220 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.*' > "$out/gpu_train.log" 2>&1 ) &
tnl 2 262144 tnl1b_1gpu_tiles_262144 &
tnl 3 524288 tnl1b_1gpu_tiles_524288 &
wait
for f in gpu_attention gpu_schedules gpu_train; do
  say "$f: $(grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED|Failure' "$out/$f.log" | head -8 | tr '\n' ' ')"
done
for t in tnl1b_1gpu_tiles_262144 tnl1b_1gpu_tiles_524288; do
  say "$t $(tail -n 1 "$out/$t.err") $(grep -h '"step"' "$out/$t.jsonl" | cut -c1-260 | tr '\n' ' ') $(grep -m1 -i error "$out/$t.err")"
done
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
l=$(left); timeout $(( l - 110 > 130 ? 130 : l - 110 )) ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 \
  --layout documents --algos auto,ulysses-overlap,ulysses,ring-return --rounds 2 --big-from 4194304 $common \
  >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs rc $? $(grep -c seqpar_ring "$out/docs.jsonl") lines"
l=$(left); timeout $(( l - 25 > 90 ? 90 : l - 25 )) ./build-gpu/bench_gpu_ring --seqs 262144,524288 --mask causal --layout zigzag \
  --algos auto,ulysses-overlap,ulysses,ring-return --rounds 2 --big-from 4194304 $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $? $(grep -c seqpar_ring "$out/causal.jsonl") lines"
l=$(left); [ $l -gt 22 ] && { timeout $(( l - 5 > 25 ? 25 : l - 5 )) ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 \
  --layout documents --algos ulysses-overlap --trace $common >> "$out/docs_trace.jsonl" 2>> "$out/err.log"; say "trace rc $?"; }
say end
pack
