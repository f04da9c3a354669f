#!/usr/bin/env bash
# seqpar train surviving killed ranks under torchrun, on CPU ranks (the tcp communicator): two
# processes train 8 steps, saving every 2 (--resume auto). SEQPAR_FAULT_KILL makes one rank
# SIGKILL itself at a chosen point, once per torchrun attempt; torchrun --max-restarts=3 starts
# the job again, which resumes from the newest whole checkpoint. Run 1 loses a rank twice (rank 1
# in the forward of step 3, then rank 0 in the optimizer step of step 6); run 2 loses rank 0
# halfway through writing a checkpoint, then rank 1 in the backward. Both must end with weights
# equal bit for bit to an undisturbed run's, having restarted twice. A peer's death must end the
# surviving rank at once on CPU ranks (no waiting out the communicator timeout, 60 s here), and
# within that timeout plus 10 s on GPUs.
# DEVICE=cuda runs it on two GPUs (NCCL, --deterministic, so that bit for bit still holds).
# Usage: [DEVICE=cuda] cli_train_torchrun_restart.sh path/to/seqpar  (TORCHRUN: the launcher
# command; exit 77 when there is none, or with DEVICE=cuda and fewer than 2 GPUs)
set -uo pipefail
bin="$(realpath "$1")"
read -r -a torchrun <<< "${TORCHRUN:-torchrun}"
"${torchrun[@]}" --help > /dev/null 2>&1 || { echo "SKIP: no torchrun (${torchrun[*]})"; exit 77; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1 SEQPAR_COMM_TIMEOUT_S=60 SEQPAR_JOB_TOKEN="restart-test-$$"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
args=(train --batch 4 --steps 8 --warmup 2 --threads-per-rank 1)
if [ "${DEVICE:-cpu}" = cuda ]; then
  [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] || { echo "SKIP: needs 2 GPUs"; exit 77; }
  # Our CUDA kernels take head dims 64 and 128: a small model with 64.
  echo '{"vocab": 256, "hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512}' > "$dir/config.json"
  args+=(--device cuda --deterministic --seq 512 --config "$dir/config.json")
else
  args+=(--device cpu --seq 64)
fi
launch() {  # launch NAME [train args...]: one torchrun job of 2 processes on a free port pair
  local name="$1"; shift
  local port=$((20000 + RANDOM % 20000))
  "${torchrun[@]}" --nnodes 1 --nproc-per-node 2 --max-restarts 3 --master-addr 127.0.0.1 \
    --master-port "$port" --no-python "$bin" "${args[@]}" "$@" > "$dir/$name.out" 2> "$dir/$name.err"
}

start=$(date +%s)
launch straight --export "$dir/straight" || { cat "$dir/straight.err"; fail "the undisturbed run"; }
for run in 1 2; do
  if [ $run = 1 ]; then faults="forward:3:1:0,optimizer:6:0:1"; else faults="save:4:0:0,backward:5:1:1"; fi
  SEQPAR_FAULT_KILL="$faults" launch "faulted$run" --checkpoint-dir "$dir/ck$run" --save-every 2 --resume auto \
    --export "$dir/faulted$run" || { tail -n 40 "$dir/faulted$run.err"; fail "run $run did not finish"; }
  kills=$(grep -c "SEQPAR_FAULT_KILL: rank" "$dir/faulted$run.err")
  [ "$kills" = 2 ] || { cat "$dir/faulted$run.err"; fail "run $run: $kills kills, not 2"; }
  grep -q "resumed from .*step-0000000[24].ckpt" "$dir/faulted$run.err" ||
    { cat "$dir/faulted$run.err"; fail "run $run never resumed from a checkpoint"; }
  cmp -s "$dir/straight/model.safetensors" "$dir/faulted$run/model.safetensors" ||
    fail "run $run's final weights differ from the undisturbed run's"
done
# Run 2's first kill left a half-written .tmp beside the step-2 checkpoint, which the restart
# skipped: it resumed from step 2.
grep -q "resumed from .*step-00000002.ckpt at step 2" "$dir/faulted2.err" ||
  { cat "$dir/faulted2.err"; fail "run 2 did not resume from step 2 after the torn save"; }
took=$(($(date +%s) - start))
# No hang: on CPU ranks a survivor sees its peer's connection close at once, so three jobs and
# four restarts take well under the 60 s a single waited-out timeout would; on GPUs (NCCL sees
# no closed connection) each fault may cost up to the communicator timeout plus 10 s.
if [ "${DEVICE:-cpu}" = cuda ]; then limit=$((3 * 30 + 4 * (60 + 10))); else limit=150; fi
[ $took -lt $limit ] || fail "took $took s (limit $limit): a survivor waited for its dead peer"
echo "PASS ($took s)"
