#!/usr/bin/env bash
# The scaling run on one machine with 4 or 8 GPUs (all visible GPUs are used): causal bf16,
# B = 1, H = 32, D = 128 at 16K, 64K and 256K tokens per GPU. In one call:
#   1. build, then ours (ring, burst, auto) and PyTorch context parallel at those lengths
#      (scripts/gpu_check.sh multi: bench_gpu_ring, bench/torch_cp_peer.py, the joined table);
#   2. each length through the tool (`seqpar attn --device cuda --algo auto --check single`),
#      checked against the whole problem on one GPU (every row) and the fp64 oracle on sampled
#      query rows. Where the whole problem does not fit on one GPU (2M on 8 GPUs), the oracle
#      rows alone check it. Host memory: about 180 GiB at 1M.
# Results go to $OUT (or ./gpu_out): multi_*.jsonl, multi_compare.md, check_<S>.json.
# Env: TOKENS_PER_GPU (default "16384 65536 262144"), SAMPLE_ROWS (default 16),
#      STAGES (default "bench check"), CHECK_TIMEOUT (seconds per check, default 500; a 1M
#      check on 4 GPUs spends minutes in host-side work).
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
stages="${STAGES:-bench check}"
status=0
if [[ " $stages " == *" bench "* ]]; then
  # The largest length runs auto only, once, without a warm-up (as in the 2-GPU table).
  largest="${seqs##*,}"
  MULTI_SEQS="$seqs" PEER_SEQS="$seqs" BENCH_ARGS="--big-from $largest" \
    bash scripts/gpu_check.sh multi || status=1
elif [[ " $stages " == *" check "* ]]; then
  BUILD_TARGETS=seqpar_cli bash scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
fi
if [[ " $stages " == *" check "* ]]; then
  for S in ${seqs//,/ }; do
    start=$(date +%s)
    timeout "${CHECK_TIMEOUT:-500}" ./build-gpu/seqpar attn --device cuda --algo auto --layout zigzag \
      --mask causal --seq "$S" --heads 32 --head-dim 128 --check single \
      --sample-rows "${SAMPLE_ROWS:-16}" --json > "$out/check_$S.json" 2> "$out/check_$S.log"
    rc=$?
    echo "S=$S check exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/scaling.txt"
    grep -E "^vs |^max |disagrees|^check" "$out/check_$S.json"
    [ $rc -ne 0 ] && status=1
  done
fi
exit $status
