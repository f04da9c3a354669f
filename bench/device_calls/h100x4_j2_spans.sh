#!/usr/bin/env bash
# One call on 4 GPUs (session j, 2026-11-28, the second): span blocks in position order (72b8aac).
#  1. build; test_gpu_schedules (every schedule against the fp64 oracle, P thread ranks on one GPU)
#  2. lognormal documents, documents layout, GQA 32:8: 256K and 512K interleaved rounds, 1M one run each
#  3. dense causal, zigzag: 256K, one round of auto, ring-return, ulysses, ulysses-ring, with step traces of ulysses
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-400}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.log 2>/dev/null; rm -f *.jsonl *.log); }
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring test_gpu_schedules" timeout 240 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
OMP_NUM_THREADS=8 timeout 120 ./build-gpu/tests/test_gpu_schedules > "$out/gpu_schedules.log" 2>&1
say "gpu_schedules rc $? $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_schedules.log" | head -8 | tr '\n' ' ')"
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
timeout 100 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ring-return,ulysses,ulysses-ring --rounds 2 --big-from 1048576 --big-algos auto,ring-return,ulysses,ulysses-ring \
  $common >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs rc $?"
timeout 60 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents --algos ulysses --trace \
  $common >> "$out/docs_trace.jsonl" 2>> "$out/err.log"
say "docs trace rc $?"
timeout 90 ./build-gpu/bench_gpu_ring --seqs 262144 --mask causal --layout zigzag --algos auto,ring-return,ulysses,ulysses-ring \
  $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $?"
say end
pack
