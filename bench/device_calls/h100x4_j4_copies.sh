#!/usr/bin/env bash
# One short call on 4 GPUs (session j, 2026-11-28, the last, ~300 s of device time left): same-dtype copies
# as cudaMemcpy2DAsync (fb0dff3) and the planner's whole-sequence rate (ba810bd).
#  1. build; test_gpu_schedules' Ulysses and documents cases against the fp64 oracle
#  2. 256K lognormal documents (documents layout) and 256K causal (zigzag), GQA 32:8, auto against the
#     Ulysses forms and ring-return, interleaved; a trace of ulysses on the documents
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=60
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-190}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.log 2>/dev/null; rm -f *.jsonl *.log); }
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring test_gpu_schedules" timeout 150 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -B3 -A12 -m3 ' error\|Error ' | head -60; pack; exit 1; }
common="--heads 32 --head-dim 128 --kv-heads 8 --single-max 0"
timeout 25 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ring-return,ulysses,ulysses-overlap --rounds 2 $common >> "$out/docs.jsonl" 2>> "$out/err.log"
say "docs rc $?"
timeout 10 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents --algos ulysses --trace \
  $common >> "$out/docs_trace.jsonl" 2>> "$out/err.log"
say "trace rc $?"
l=$(left); timeout $(( l - 45 > 40 ? 40 : l - 45 )) ./build-gpu/bench_gpu_ring --seqs 262144 --mask causal --layout zigzag \
  --algos auto,ulysses-overlap,ring-return $common >> "$out/causal.jsonl" 2>> "$out/err.log"
say "causal rc $?"
l=$(left); OMP_NUM_THREADS=8 timeout $(( l - 5 )) ./build-gpu/tests/test_gpu_schedules --gtest_filter='*ulysses*:*documents*' > "$out/gpu_schedules.log" 2>&1
say "gpu_schedules rc $? ok $(grep -c '       OK ' "$out/gpu_schedules.log") $(grep -E '^\[  (PASSED|FAILED)|Failure' "$out/gpu_schedules.log" | head -6 | tr '\n' ' ')"
say end
pack
