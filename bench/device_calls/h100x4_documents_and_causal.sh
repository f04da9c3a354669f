#!/usr/bin/env bash
# One call on 4 GPUs (session i, 2026-11-27): issue 37's packed documents and issue 34's 4-GPU items, one call.
#  1. build (bench_gpu_ring, seqpar, test_gpu_train: call 3 reuses the build on the warm machine)
#  2. documents of lognormal lengths (docs-lognormal:8192), documents layout, GQA 32:8, 256K-1M:
#     auto, ring-return, burst-return, ulysses (a refusal prints an error line and the run goes on)
#  3. 64 documents (docs:64, lengths 1:2:...:64), documents layout, auto, 256K and 512K
#  4. dense causal (zigzag): auto, ring-return, burst-return at 256K and 512K, auto at 1M once
#  5. PyTorch context parallel, causal, the same lengths and GQA (the closest it offers)
#  6. PyTorch SDPA per document on one GPU, the same documents (lengths from step 2's lines)
#  7. each rank's visible work on the documents layout (busiest / mean) and bytes walked
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=575
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring seqpar_cli test_gpu_train test_gpu_lasp" timeout 280 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 --target bench_gpu_ring seqpar_cli test_gpu_train test_gpu_lasp 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; exit 1; }
gpus=$(nvidia-smi -L | wc -l)
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
timeout 150 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ring-return,burst-return,ulysses --big-from 2097152 $common >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs lognormal rc $?"
timeout 60 ./build-gpu/bench_gpu_ring --seqs 262144,524288 --mask docs:64 --layout documents --algos auto $common \
  >> "$out/docs64.jsonl" 2>> "$out/err.log"
say "docs64 rc $?"
timeout 150 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask causal --layout zigzag \
  --algos auto,ring-return,burst-return --big-from 1048576 --big-algos auto $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $?"
l=$(left); timeout $(( l - 130 )) torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py --seqs 262144,524288,1048576 \
  --kv-heads 8 --max-seconds $(( l - 160 )) >> "$out/peer_cp.jsonl" 2>> "$out/err.log"
say "peer cp rc $?"
l=$(left); timeout $(( l - 50 )) python3 bench/torch_sdpa_docs_peer.py --lengths-from "$out/docs.jsonl" --kv-heads 8 \
  >> "$out/peer_sdpa_docs.jsonl" 2>> "$out/err.log"
say "peer sdpa docs rc $?"
for S in 262144 524288 1048576; do
  [ "$(left)" -lt 12 ] && break
  timeout 12 ./build-gpu/seqpar attn --device cuda --ranks "$gpus" --algo auto --layout documents --mask docs-lognormal:8192 \
    --seq "$S" --heads 4 --kv-heads 1 --head-dim 128 --check none --json >> "$out/attn.log" 2>&1
  say "attn $S rc $?"
done
say "end"
cd "$out" && tar czf all.tgz *.jsonl *.log 2>/dev/null; rm -f *.jsonl attn.log err.log
