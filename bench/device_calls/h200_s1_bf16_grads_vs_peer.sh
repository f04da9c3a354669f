#!/usr/bin/env bash
# One call on 1 GPU (session s, 2026-11-29), issue 36: the training step after attention's dO and
# SwiGLU's da come out of their products in bf16 (fbb44f1; they were fp32, dO then cast). The GPU
# tests of the layers and the trainer first (ModelCuda.*: the bf16-dx product against the CPU
# oracle; GpuTrain.*), then the 1B with `--checkpointing none` at 32K beside PyTorch's peer (both
# profiled by kind, as call r2), at 64K (r1: 46.4% MFU, 94.1 GiB) and at 128K with the MLP tiled
# (r2: 44.8%, 87.3 GiB).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 16 "seqpar_cli test_model_cuda test_gpu_train"
for t in test_model_cuda test_gpu_train; do
  timeout 90 ./build-gpu/tests/$t > "$out/$t.log" 2>&1
  say "$t rc $?: $(grep -c '^\[       OK' "$out/$t.log") ok, $(grep -c '^\[  FAILED  \]' "$out/$t.log") failed lines, $(grep -c '^\[  SKIPPED' "$out/$t.log") skipped"
  grep '^\[  FAILED  \]' "$out/$t.log" | head -10 >> "$out/summary.txt"
done
train_text
train1b none_32k 32768 4 --checkpointing none
l=$(left); [ $l -gt 150 ] && { timeout $(( l - 130 < 150 ? l - 130 : 150 )) torchrun --standalone --nproc_per_node=1 \
  bench/torch_train_peer.py --seqs 32768 --steps 4 --data $txt --profile > "$out/peer_1b_32k.jsonl" 2> "$out/peer_1b_32k.err"
  say "peer 1B 32K rc $? $(grep -m1 -i 'error' "$out/peer_1b_32k.err" | head -c 300)"
  grep '^{' "$out/peer_1b_32k.jsonl" | tail -3 | cut -c1-1500 >> "$out/summary.txt"; }
train1b none_64k 65536 3 --checkpointing none
train1b none_tiled_128k 131072 3 --checkpointing none --tile-tokens 8192
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
