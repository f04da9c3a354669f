#!/usr/bin/env bash
# On the GPU machine: build with the carried dependencies, then run the named stages; logs and
# JSON lines go to $OUT (or ./gpu_out). Stages:
#   tests   all ctest cases (GPU ones included)
#   bench   single-GPU kernels and the PyTorch SDPA peer
#   multi   multi-GPU ring/Burst benchmark and the PyTorch context-parallel peer, same run
#           (MULTI_SEQS and PEER_SEQS choose the lengths)
#   build   nothing more than the build every stage starts with
# Usage: bash scripts/gpu_check.sh [tests] [bench] [multi]   (no stage, or all: all three)
# BUILD_TARGETS (e.g. "bench_gpu_ring") builds only those targets; BUILD_JOBS (default 16) the
# parallel compile jobs.
set -uo pipefail
cd "$(dirname "$0")/.."
stages="${*:-all}"
[ "$stages" = all ] && stages="tests bench multi"
out="${OUT:-gpu_out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
source scripts/gpu_env.sh  # prefix, lib_path, inc_path; cuDNN and NCCL from PyTorch's wheels
set -e
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
  -DCMAKE_LIBRARY_PATH="$lib_path" -DCMAKE_INCLUDE_PATH="$inc_path" 2>&1 | tee "$out/cmake.log" | grep -E "seqpar|Error" || true
cmake --build build-gpu -j "${BUILD_JOBS:-16}" ${BUILD_TARGETS:+--target $BUILD_TARGETS} 2>&1 | tail -n 20 | tee "$out/build.log"
set +e
status=0
for stage in $stages; do
  case "$stage" in
    tests)
      (cd build-gpu && OMP_NUM_THREADS=16 ctest --output-on-failure -j 4 ${CTEST_ARGS:-} 2>&1) | tee "$out/ctest.log" | tail -n 40
      status=${PIPESTATUS[0]} ;;
    bench)
      ./build-gpu/bench_gpu_attention --json 2>&1 | tee "$out/ours.jsonl"
      python3 bench/torch_sdpa_peer.py 2>&1 | tee "$out/peer.jsonl"
      python3 bench/compare_kernels.py "$out/ours.jsonl" "$out/peer.jsonl" | tee "$out/compare.md" ;;
    multi)
      gpus=$(nvidia-smi -L | wc -l)
      export SEQPAR_COMM_TIMEOUT_S=120
      ./build-gpu/bench_gpu_ring --seqs "${MULTI_SEQS:-16384,65536,131072,262144,524288,1048576,2097152}" \
        ${BENCH_ARGS:-} 2>&1 | tee -a "$out/multi_ours.jsonl"
      torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py \
        --seqs "${PEER_SEQS:-16384,65536,131072,262144,524288,1048576}" ${PEER_ARGS:-} 2>&1 | tee -a "$out/multi_peer.jsonl"
      python3 bench/compare_multi_gpu.py "$out/multi_ours.jsonl" "$out/multi_peer.jsonl" | tee "$out/multi_compare.md" ;;
    build) ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
