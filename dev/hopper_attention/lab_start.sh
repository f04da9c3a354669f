# lab_start.sh: the start both one-call GPU scripts of the lab share (run_h34.sh, run_masks.sh),
# sourced from the repository root after `out` and `t0` are set: the device environment, `say`
# (timestamped lines into $out/summary.txt), the GPU line, the library's test_backends built in
# the background (lib_pid), then the lab's own build; leaves here, fwd and bwd set.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
say "rev $(cat .snap_rev 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
# LAB_LIB=0: no library build (lib_pid stays empty).
lib_pid=""
[ "${LAB_LIB:-1}" = 1 ] && (
  source scripts/gpu_env.sh
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
    -DCMAKE_LIBRARY_PATH="$lib_path" -DCMAKE_INCLUDE_PATH="$inc_path" 2>&1 | grep -E "seqpar|Error|error"
  nice cmake --build build-gpu -j 8 --target test_backends 2>&1 | grep -E "warning|error|Linking" | tail -n 30
) > "$out/lib_build.log" 2>&1 &
[ "${LAB_LIB:-1}" = 1 ] && lib_pid=$!
here=dev/hopper_attention
bash $here/build.sh > "$out/lab_build.log" 2>&1 || say "LAB BUILD FAILED"
say "lab built: $(grep -h 'spill stores' $here/build/ptxas*.txt | grep -vc ' 0 bytes spill') lines with spills"
fwd=$here/build/hopper_fwd_test; bwd=$here/build/hopper_bwd_test
