# lab_call.sh: the start of the lab's one-call GPU scripts (run_*.sh since session w),
# sourced from the repository root once `out` is set:
# the device environment (no NVLink multicast, one GPU, unbuffered Python), t0 and the deadline
# (BUDGET seconds, default 400) with `left`, `say` (timestamped lines into $out/summary.txt, which
# starts with the GPU line), and `here`, the lab's folder.
t0=$(date +%s); deadline=$((t0 + ${BUDGET:-400}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
here=dev/hopper_attention
