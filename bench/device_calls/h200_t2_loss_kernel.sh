#!/usr/bin/env bash
# One call on 1 GPU (session t, 2026-11-29), issue 36, after call t1 (h200_t1_tuned_gemm.sh): the
# LM head's loss kernel moves its rows 16 bytes a load (was one element a thread a load: 12 ms of
# the head's 55 ms forward at vocab 128256, 1,024-row chunks) and the tuned products keep only
# candidates with the first's bits (t1: ModelCuda.FusedLmHeadLoss saw the loss change between
# two calls of one shape). test_model_cuda; the head against Liger-Kernel in two interleaved
# rounds (ours tuned, the peer on our dumped bits); the 1B preset at 32K and 64K tokens with
# --checkpointing none. Carry [".carry"] (snapshot in .carry/snap, Liger's wheel in .carry/whl).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-300}
source bench/device_calls/call_start.sh 16 "bench_gpu_lm_head seqpar_cli test_model_cuda"
OMP_NUM_THREADS=16 timeout 60 ./build-gpu/tests/test_model_cuda > "$out/test_model_cuda.log" 2>&1
say "test_model_cuda rc $?: $(grep -c '^\[       OK' "$out/test_model_cuda.log") ok, $(grep -c '^\[  FAILED  \]' "$out/test_model_cuda.log") failed lines"
grep '^\[  FAILED  \]\|Failure\|Which is' "$out/test_model_cuda.log" | head -12 >> "$out/summary.txt"
liger_env
data=/tmp/lm_head_data; rm -rf "$data"
for round in 1 2; do
  dump=(); [ $round = 1 ] && dump=(--dump "$data")
  [ $(left) -lt 60 ] && { say "out of time before the head, round $round"; break; }
  timeout 60 ./build-gpu/bench_gpu_lm_head --tokens 32768 --hidden 4096 --vocab 128256 --chunks 1024,4096 \
    --logits f32,bf16 "${dump[@]}" >> "$out/lm_head_ours.jsonl" 2>> "$out/lm_head_ours.err"
  say "head round $round rc $?"
  peer=(--data "$data" --variants liger); [ $round = 1 ] && peer+=(--check)
  (cd bench && timeout 60 python3 -u liger_flce_peer.py "${peer[@]}") >> "$out/lm_head_peer.jsonl" 2>> "$out/lm_head_peer.err"
  say "peer round $round rc $?"
done
python3 bench/device_calls/lm_head_summary.py "$out/lm_head_ours.jsonl" "$out/lm_head_peer.jsonl" | tee -a "$out/summary.txt"
train1b 32k_none 32768 6 --checkpointing none
train1b 64k_none 65536 4 --checkpointing none
say end
PACK_GLOBS="*.log *.err" pack
