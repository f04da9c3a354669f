# Sourced by the GPU scripts (gpu_check.sh, torch_gpu_check.sh) on the GPU machine: the
# environment a build there needs. Sets `prefix` (the carried OS packages, .carry/deps/usr),
# `lib_path` and `inc_path` (for CMAKE_LIBRARY_PATH / CMAKE_INCLUDE_PATH), NCCL_HOME when NCCL
# comes from PyTorch's wheel, LD_LIBRARY_PATH, and NCCL's multicast off (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
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
