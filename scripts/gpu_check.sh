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
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
prefix="$PWD/.carry/deps/usr"
export LD_LIBRARY_PATH="$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"  # OpenBLAS, carried
# cuDNN and NCCL may live in PyTorch's wheels rather than the toolkit; link the unversioned
# names CMake looks for.
wheel_dir() { python3 -c "import nvidia.$1, os; print(nvidia.$1.__path__[0])" 2>/dev/null || true; }
link_lib() {  # link_lib NAME DIR -> prints a folder holding libNAME.so
  if [ -e "$2/lib/lib$1.so" ]; then echo "$2/lib"; return; fi
  mkdir -p ".carry/$1_lib" && ln -sf "$2/lib/lib$1.so."* ".carry/$1_lib/" 2>/dev/null
  ln -sf "$(ls "$2"/lib/lib$1.so.* | head -n 1)" ".carry/$1_lib/lib$1.so"
  echo "$PWD/.carry/$1_lib"
}
lib_path=""
inc_path=""
cudnn_dir="$(wheel_dir cudnn)"
if [ -n "$cudnn_dir" ]; then
  lib_path="$(link_lib cudnn "$cudnn_dir")"
  inc_path="$cudnn_dir/include"
  export LD_LIBRARY_PATH="$cudnn_dir/lib:${LD_LIBRARY_PATH:-}"
fi
nccl_dir="$(wheel_dir nccl)"
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ -n "$nccl_dir" ]; then
  export NCCL_HOME="$nccl_dir"
  lib_path="$lib_path;$(link_lib nccl "$nccl_dir")"
  export LD_LIBRARY_PATH="$nccl_dir/lib:${LD_LIBRARY_PATH:-}"
fi
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
