#!/usr/bin/env bash
# One call on 4 GPUs (session k, 2026-11-28): issue 37's rows in one call after the batched copies
# (cf73b11): lognormal documents (mean 8K) 256K-1M on the documents layout, our dense causal at the
# same lengths, PyTorch context parallel (causal, same tokens) and PyTorch SDPA run per document on
# one GPU.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-k" && ln -sfn "$root/build-gpu-k" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-575}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.log 2>/dev/null; rm -f *.jsonl *.log); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring" timeout 240 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
timeout 80 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ulysses-overlap,ring-return --rounds 2 --big-from 4194304 $common >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs rc $? $(grep -c seqpar_ring "$out/docs.jsonl") lines"
timeout 75 ./build-gpu/bench_gpu_ring --seqs 262144,524288 --mask causal --layout zigzag --algos auto,ulysses-overlap \
  --rounds 2 --big-from 4194304 $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $? $(grep -c seqpar_ring "$out/causal.jsonl") lines"
timeout 75 ./build-gpu/bench_gpu_ring --seqs 1048576 --mask causal --layout zigzag --algos auto --rounds 1 \
  --big-from 4194304 $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal 1M rc $? $(grep -c seqpar_ring "$out/causal.jsonl") lines"
gpus=$(nvidia-smi -L | wc -l)
l=$(left); timeout $(( l - 95 > 150 ? 150 : l - 95 )) torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py \
  --seqs 262144,524288 --kv-heads 8 --max-seconds 120 >> "$out/peer_cp.jsonl" 2>> "$out/err.log"
say "peer cp rc $?"
l=$(left); timeout $(( l - 5 > 85 ? 85 : l - 5 )) python3 bench/torch_sdpa_docs_peer.py --lengths-from "$out/docs.jsonl" --kv-heads 8 \
  >> "$out/peer_sdpa_docs.jsonl" 2>> "$out/err.log"
say "peer sdpa docs rc $?"
say end
pack
