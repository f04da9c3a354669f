#!/usr/bin/env bash
# On the GPU machine: build with the carried dependencies, run the GPU tests, then the GPU
# kernel benchmark and its PyTorch peer in the same run. Logs and JSON lines go to $OUT (or
# ./gpu_out). Usage: bash scripts/gpu_check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-gpu_out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
prefix="$PWD/.carry/deps/usr"
# The cuDNN library may live in PyTorch's wheel rather than the toolkit.
cudnn_lib="$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "lib"))' 2>/dev/null || true)"
cudnn_inc="$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "include"))' 2>/dev/null || true)"
if [ -n "$cudnn_lib" ] && [ ! -e "$cudnn_lib/libcudnn.so" ] && [ -e "$cudnn_lib/libcudnn.so.9" ]; then
  mkdir -p .carry/cudnn_lib && ln -sf "$cudnn_lib/libcudnn.so.9" .carry/cudnn_lib/libcudnn.so
  cudnn_lib_dir="$PWD/.carry/cudnn_lib"
  export LD_LIBRARY_PATH="$cudnn_lib:${LD_LIBRARY_PATH:-}"
else
  cudnn_lib_dir="$cudnn_lib"
fi
set -e
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
  -DCMAKE_LIBRARY_PATH="${cudnn_lib_dir:-}" -DCMAKE_INCLUDE_PATH="${cudnn_inc:-}" 2>&1 | tee "$out/cmake.log" | grep -E "seqpar|Error" || true
cmake --build build-gpu -j 16 2>&1 | tail -n 20 | tee "$out/build.log"
set +e
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  (cd build-gpu && OMP_NUM_THREADS=16 ctest --output-on-failure -j 4 2>&1) | tee "$out/ctest.log" | tail -n 40
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  ./build-gpu/bench_gpu_attention --json 2>&1 | tee "$out/ours.jsonl"
  python3 bench/torch_sdpa_peer.py 2>&1 | tee "$out/peer.jsonl"
  python3 bench/compare_kernels.py "$out/ours.jsonl" "$out/peer.jsonl" | tee "$out/compare.md"
fi
exit $status
