#!/usr/bin/env bash
# A GPU rank that dies must not hang the others: two `seqpar attn --device cuda` processes
# bootstrap through torchrun's variables; rank 1 stalls before the backward (fault hook
# SEQPAR_FAULT_STALL_RANK) and is then killed with SIGKILL. Rank 0, waiting for it inside the
# backward, must exit non-zero with an error within the communicator timeout plus a margin.
# Exit 77 (skipped) without two GPUs. Usage: gpu_kill_rank.sh path/to/seqpar
set -uo pipefail
bin="$1"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${gpus:-0}" -lt 2 ]; then echo "needs two GPUs; skipped"; exit 77; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SEQPAR_COMM_TIMEOUT_S=20 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29000 + RANDOM % 1000)) WORLD_SIZE=2
export SEQPAR_FAULT_STALL_RANK=1
logs="$(mktemp -d)"
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r "$bin" attn --device cuda --seq 16384 --heads 8 --head-dim 128 \
    --algo burst --check none >"$logs/rank$r.log" 2>&1 &
  pids[$r]=$!
done
for _ in $(seq 1 600); do  # up to 60 s for rank 1 to reach the stall
  grep -q "stalling" "$logs/rank1.log" && break
  sleep 0.1
done
grep -q "stalling" "$logs/rank1.log" || { echo "rank 1 never stalled"; cat "$logs"/*.log; kill -9 "${pids[@]}"; exit 1; }
kill -9 "${pids[1]}"
start=$(date +%s)
# Watchdog: rank 0 gets 90 s (the 20 s communicator timeout plus margin) to exit.
while kill -0 "${pids[0]}" 2>/dev/null && [ $(( $(date +%s) - start )) -lt 90 ]; do sleep 0.2; done
if kill -0 "${pids[0]}" 2>/dev/null; then
  echo "FAIL: rank 0 still running 90 s after rank 1 was killed"
  cat "$logs/rank0.log"
  kill -9 "${pids[0]}"
  exit 1
fi
wait "${pids[0]}"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "rank 0 exited with code $rc after ${elapsed} s"
cat "$logs/rank0.log"
if [ "$rc" -eq 0 ]; then echo "FAIL: rank 0 reported success"; exit 1; fi
if [ "$elapsed" -gt 90 ]; then echo "FAIL: rank 0 took ${elapsed} s (limit 90)"; exit 1; fi
grep -qE "error|aborted" "$logs/rank0.log" || { echo "FAIL: no error message from rank 0"; exit 1; }
echo "PASS"
