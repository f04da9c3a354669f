#!/usr/bin/env bash
# The scaling run on one machine with 4 or 8 GPUs (all visible GPUs are used): causal bf16,
# B = 1, H = 32, D = 128 at 16K, 64K and 256K tokens per GPU. In one call:
#   1. build, then ours (ring, burst, auto) and PyTorch context parallel at those lengths
#      (scripts/gpu_check.sh multi: bench_gpu_ring, bench/torch_cp_peer.py, the joined table);
#   2. each length through the tool (`seqpar attn --device cuda --algo auto`), checked against
#      the fp64 oracle on sampled query and key rows.
# Results go to $OUT (or ./gpu_out): multi_*.jsonl, multi_compare.md, check_<S>.json.
# Env: TOKENS_PER_GPU (default "16384 65536 262144"), SAMPLE_ROWS (default 16).
# Run it on the GPU machine with .carry present (bash scripts/pack_device_deps.sh here first).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L | wc -l)
seqs=""
for t in ${TOKENS_PER_GPU:-16384 65536 262144}; do seqs="$seqs${seqs:+,}$((t * gpus))"; done
echo "scaling run on $gpus GPUs, S = $seqs ($(date -u +%F))" | tee "$out/scaling.txt"
# The largest length runs auto only, once, without a warm-up (as in the 2-GPU table).
largest="${seqs##*,}"
MULTI_SEQS="$seqs" PEER_SEQS="$seqs" BENCH_ARGS="--big-from $largest" \
  bash scripts/gpu_check.sh multi
status=$?
for S in ${seqs//,/ }; do
  ./build-gpu/seqpar attn --device cuda --algo auto --layout zigzag --mask causal --seq "$S" \
    --heads 32 --head-dim 128 --check single --sample-rows "${SAMPLE_ROWS:-16}" --json \
    > "$out/check_$S.json" 2>&1
  rc=$?
  echo "S=$S check exit $rc" | tee -a "$out/scaling.txt"
  [ $rc -ne 0 ] && status=1
done
exit $status
