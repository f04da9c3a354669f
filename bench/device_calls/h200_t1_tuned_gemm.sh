#!/usr/bin/env bash
# One call on 1 GPU (session t, 2026-11-29), issue 36: the model's products through cuBLASLt with
# the algorithm timed per shape (src/model/gemm_bf16.cu) against cuBLAS's default
# (SEQPAR_GEMM=cublas), in the same call: test_model_cuda (every candidate gives the same bits);
# the fused LM head + loss against Liger-Kernel (hidden 4096, vocab 128256, 32K tokens; two
# interleaved rounds of ours tuned, ours cublas, the peer on our dumped bits); the 1B preset at
# 32K tokens with --checkpointing none, tuned / cublas / tuned; then test_gpu_train and
# test_gpu_attention with the time left. Carry [".carry"] with a `git archive` in .carry/snap and
# Liger's wheel (and packaging) in .carry/whl (pip download liger-kernel==0.8.5 packaging --no-deps).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 16 "bench_gpu_lm_head seqpar test_model_cuda test_gpu_train test_gpu_attention"
suite test_model_cuda 60
liger_env
data=/tmp/lm_head_data; rm -rf "$data"
lm_head() {  # mode [args]: ours, with SEQPAR_GEMM=mode
  local mode=$1; shift
  [ $(left) -lt 60 ] && { say "out of time before the head ($mode)"; return 9; }
  SEQPAR_GEMM=$mode timeout 60 ./build-gpu/bench_gpu_lm_head --tokens 32768 --hidden 4096 --vocab 128256 \
    --chunks 1024,4096 --logits f32,bf16 "$@" | sed "s/^{/{\"gemm\":\"$mode\",/" >> "$out/lm_head_ours.jsonl" 2>> "$out/lm_head_ours.err"
  say "head $mode rc $?"
}
for round in 1 2; do
  if [ $round = 1 ]; then lm_head tuned --dump "$data"; else lm_head tuned; fi
  lm_head cublas
  [ $(left) -lt 90 ] && { say "out of time before the peer, round $round"; break; }
  peer=(--data "$data" --variants liger,liger_fp32_accum); [ $round = 1 ] && peer+=(--check)
  (cd bench && timeout 80 python3 -u liger_flce_peer.py "${peer[@]}") >> "$out/lm_head_peer.jsonl" 2>> "$out/lm_head_peer.err"
  say "peer round $round rc $? | $(tail -n 1 "$out/lm_head_peer.err")"
done
python3 bench/device_calls/lm_head_summary.py "$out/lm_head_ours.jsonl" "$out/lm_head_peer.jsonl" | tee -a "$out/summary.txt"
for run in tuned1 cublas tuned2; do
  export SEQPAR_GEMM=${run%[0-9]}
  train1b "32k_none_$run" 32768 6 --checkpointing none
done
unset SEQPAR_GEMM
suite test_gpu_train 120
suite test_gpu_attention 400
say end
PACK_GLOBS="*.log *.err" pack
