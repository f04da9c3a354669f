#!/usr/bin/env bash
# One call on 4 GPUs (session j, 2026-11-28, the last): issues 37, 35 and 34's 4-GPU rows after the
# Ulysses span order (72b8aac), the switch-port planner (745b307), the parts join (1b82fa7) and
# ulysses-overlap (926bee7).
#  1. build; test_gpu_schedules' Ulysses cases (ulysses-overlap's new ones among them) against the fp64 oracle
#  2. lognormal documents (mean 8K), documents layout, GQA 32:8, 256K-1M, warm runs, 2 interleaved rounds:
#     auto, ring-return, ulysses, ulysses-overlap, ulysses-ring
#  3. dense causal (zigzag), GQA 32:8: 64K (16K a GPU, with the one-GPU reference), 256K (with it), 512K:
#     auto, ring-return, burst-return, ulysses, ulysses-overlap; 1M: auto once; MHA at 64K likewise
#  4. PyTorch context parallel, causal: GQA at 64K, 256K, 512K; MHA at 64K; PyTorch SDPA per document
#  5. step traces of ulysses-overlap on the 256K documents; the trainer's new GPU tests where given (TESTS=...)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-565}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.log 2>/dev/null; rm -f *.jsonl *.log); }
targets="bench_gpu_ring test_gpu_schedules"; [ -n "${TESTS:-}" ] && targets="$targets test_gpu_train"
BUILD_JOBS=64 BUILD_TARGETS="$targets" timeout 240 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
OMP_NUM_THREADS=8 timeout 75 ./build-gpu/tests/test_gpu_schedules --gtest_filter='*ulysses*' > "$out/gpu_schedules.log" 2>&1
say "gpu_schedules rc $? ok $(grep -c '       OK ' "$out/gpu_schedules.log") $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_schedules.log" | head -6 | tr '\n' ' ')"
common="--heads 32 --head-dim 128"
algos=auto,ring-return,ulysses,ulysses-overlap,ulysses-ring
timeout 110 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 --layout documents \
  --algos $algos --rounds 2 --big-from 4194304 --kv-heads 8 --single-max 0 $common >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs rc $? $(grep -c seqpar_ring "$out/docs.jsonl") lines"
calgos=auto,ring-return,burst-return,ulysses,ulysses-overlap
timeout 40 ./build-gpu/bench_gpu_ring --seqs 65536 --mask causal --layout zigzag --algos $calgos --rounds 2 --kv-heads 8 \
  --single-max 65536 $common >> "$out/causal.jsonl" 2>> "$out/err.log"
timeout 40 ./build-gpu/bench_gpu_ring --seqs 65536 --mask causal --layout zigzag --algos $calgos --rounds 2 --kv-heads 32 \
  --single-max 65536 $common >> "$out/causal_mha.jsonl" 2>> "$out/err.log"
say "causal 64K rc $?"
timeout 110 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask causal --layout zigzag --algos $calgos \
  --big-from 1048576 --big-algos auto --kv-heads 8 --single-max 65536 $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $? $(grep -c seqpar_ring "$out/causal.jsonl") lines"
gpus=$(nvidia-smi -L | wc -l)
l=$(left); timeout $(( l - 150 > 150 ? 150 : l - 150 )) torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py --seqs 65536,262144,524288 \
  --kv-heads 8 --max-seconds 120 >> "$out/peer_cp.jsonl" 2>> "$out/err.log"
say "peer cp rc $?"
l=$(left); timeout $(( l - 110 > 45 ? 45 : l - 110 )) torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py --seqs 65536 \
  --max-seconds 30 >> "$out/peer_cp_mha.jsonl" 2>> "$out/err.log"
say "peer cp mha rc $?"
l=$(left); timeout $(( l - 45 > 80 ? 80 : l - 45 )) python3 bench/torch_sdpa_docs_peer.py --lengths-from "$out/docs.jsonl" --kv-heads 8 \
  >> "$out/peer_sdpa_docs.jsonl" 2>> "$out/err.log"
say "peer sdpa docs rc $?"
l=$(left); [ $l -gt 30 ] && { timeout 20 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents \
  --algos ulysses-overlap --trace --kv-heads 8 --single-max 0 $common >> "$out/docs_trace.jsonl" 2>> "$out/err.log"; say "trace rc $?"; }
if [ -n "${TESTS:-}" ] && [ "$(left)" -gt 40 ]; then
  l=$(left); OMP_NUM_THREADS=8 timeout $(( l - 10 )) ./build-gpu/tests/test_gpu_train --gtest_filter="$TESTS" > "$out/gpu_train.log" 2>&1
  say "gpu_train rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_train.log" | head -6 | tr '\n' ' ')"
fi
say end
pack
