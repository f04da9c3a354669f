#!/usr/bin/env bash
# run_device.sh: the lab's one-call GPU session: (re)build if the carried binary does not run
# there, CPU-reference checks of every variant (each in its own process under a timeout, so a
# deadlocked variant costs its timeout, not the call), then our timings and PyTorch cuDNN SDPA's
# on the same GPU. Logs go to $OUT (or ./out). Run from the repository root:
#   CHECK_VARIANTS="basic overlap pingpong pingpong3" BENCH_VARIANTS="..." SEQS="8192 16384 32768" \
#   bash dev/hopper_attention/run_device.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
here=dev/hopper_attention
out=${OUT:-$here/out}
mkdir -p "$out"
bin=$here/build/hopper_fwd_test
CHECK_VARIANTS=${CHECK_VARIANTS:-"basic overlap pingpong pingpong3"}
CHECK64_VARIANTS=${CHECK64_VARIANTS:-"basic pingpong pingpong3"}
BENCH_VARIANTS=${BENCH_VARIANTS:-"basic overlap pingpong pingpong3"}
GQA_VARIANTS=${GQA_VARIANTS:-"pingpong pingpong3"}
D64_VARIANTS=${D64_VARIANTS:-"pingpong pingpong3"}
SEQS=${SEQS:-"8192 16384 32768"}
REPS=${REPS:-10}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  "$bin" >/dev/null 2>&1
  if [ $? -ne 2 ]; then
    echo "carried binary does not run here: rebuilding"; bash $here/build.sh | grep -E "error|registers|spill" ; fi
  for v in $CHECK_VARIANTS; do timeout 120 "$bin" check "$v" 128 || echo "CHECK-FAILED $v D=128 rc=$?"; done
  for v in $CHECK64_VARIANTS; do timeout 120 "$bin" check "$v" 64 || echo "CHECK-FAILED $v D=64 rc=$?"; done
  for S in $SEQS; do for c in 0 1; do
    for v in $BENCH_VARIANTS; do timeout 60 "$bin" bench "$v" "$S" "$c" 32 32 128 "$REPS" || echo "BENCH-FAILED $v"; done
    for v in $GQA_VARIANTS; do timeout 60 "$bin" bench "$v" "$S" "$c" 32 8 128 "$REPS" || echo "BENCH-FAILED $v"; done
  done; done
  for v in $D64_VARIANTS; do for c in 0 1; do timeout 60 "$bin" bench "$v" 16384 "$c" 32 32 64 "$REPS"; done; done
  timeout 200 python3 $here/cudnn_peer.py "$(echo $SEQS | tr ' ' ',')" --kv-heads 32,8 --dims 128 --reps "$REPS"
  timeout 60 python3 $here/cudnn_peer.py 16384 --kv-heads 32 --dims 64 --reps "$REPS"
} 2>&1 | tee "$out/run.log"
grep -E "^BENCH" "$out/run.log" | sort -k4,4 -k5,5 -k7,7 -k6,6 > "$out/bench_sorted.txt"
echo "==== summary"; grep -E "check .*cases pass|CHECK-FAILED|FAIL " "$out/run.log"; cat "$out/bench_sorted.txt"
