#!/usr/bin/env bash
# The scaling run on one machine with 4 or 8 GPUs (all visible GPUs are used): causal bf16,
# B = 1, H = 32, D = 128 at 16K, 64K and 256K tokens per GPU. In one call:
#   1. build, then ours (ring, burst, auto) and PyTorch context parallel at those lengths
#      (scripts/gpu_check.sh multi: bench_gpu_ring, bench/torch_cp_peer.py, the joined table);
#   2. each length through the tool (`seqpar attn --device cuda --algo auto --check single`),
#      checked against the whole problem on one GPU (every row) and the fp64 oracle on sampled
#      query rows. Where the whole problem does not fit on one GPU (2M on 8 GPUs), the oracle
#      rows alone check it. Host memory: about 120 GiB at 1M.
#   3. (stage "longest", not in the default) the longest S: PyTorch once at each of
#      PEER_LONGEST (it stops at its first failure), ours once at OURS_LONGEST.
# Results go to $OUT (or ./gpu_out): multi_*.jsonl, multi_compare.md, check_<S>.json,
# longest_{peer,ours}.jsonl (and longest_peer.err, where a failure's reason is).
# Env: TOKENS_PER_GPU (default "16384 65536 262144"), SAMPLE_ROWS (default 16),
#      STAGES (default "bench check"; add "longest"), CHECK_TIMEOUT (seconds per check,
#      default 500; a 1M check on 4 GPUs spends minutes in host-side work),
#      PEER_LONGEST (default 384K, 512K and 640K tokens per GPU), OURS_LONGEST (default 1M
#      tokens per GPU: 4M on 4 GPUs, about 4 minutes), LONGEST_TIMEOUT (seconds for each of
#      the two, default 120 + 70 per GPU).
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
else
  BUILD_TARGETS="seqpar_cli bench_gpu_ring" bash scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
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
if [[ " $stages " == *" longest "* ]]; then
  # Ours at 1M tokens per GPU takes about a minute per GPU (P (S/P)^2 work per GPU); PyTorch's
  # budget (--max-seconds) ends before the timeout, so its own skip logic stops it first.
  peer_seqs="${PEER_LONGEST:-$((393216 * gpus)),$((524288 * gpus)),$((655360 * gpus))}"
  ours="${OURS_LONGEST:-$((1048576 * gpus))}"
  limit="${LONGEST_TIMEOUT:-$((120 + 70 * gpus))}"
  timeout "$limit" torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py \
    --seqs "$peer_seqs" --once --nccl-timeout 60 --max-seconds $((limit - 30)) \
    > "$out/longest_peer.jsonl" 2> "$out/longest_peer.err"
  echo "PyTorch at $peer_seqs: exit $? (a failed S ends it with 3)" | tee -a "$out/scaling.txt"
  grep '"torch_cp"' "$out/longest_peer.jsonl"
  SEQPAR_COMM_TIMEOUT_S=120 timeout "$limit" ./build-gpu/bench_gpu_ring --seqs "$ours" --algos auto \
    > "$out/longest_ours.jsonl" 2>&1
  rc=$?
  echo "ours at $ours: exit $rc" | tee -a "$out/scaling.txt"
  grep seqpar_ring "$out/longest_ours.jsonl"
  [ $rc -ne 0 ] && status=1
fi
exit $status
