#!/usr/bin/env bash
# One call on 1 GPU (session q, 2026-11-28), issue 36: what the 1B preset's recompute costs. With
# --checkpointing attention the backward re-runs every layer's forward but the attention (norms,
# projections, RoPE, MLP); with none it re-runs nothing, for more memory. The 1B preset at 32K
# tokens (a GPU's share of 64K on two), none / attention / none, then none at 64K (128K on two).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-260}
source bench/device_calls/call_start.sh 16 "seqpar_cli"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train1b() {  # tag seq policy
  local l=$(left); [ $l -lt 40 ] && { say "out of time before 1B $1"; return 9; }
  timeout $(( l - 10 < 60 ? l - 10 : 60 )) ./build-gpu/seqpar train --device cuda --gpus 1 --model 1b --data "text:$txt" \
    --seq $2 --batch 1 --steps 4 --warmup 1 --checkpointing $3 --profile --json \
    > "$out/train_1b_$1.jsonl" 2> "$out/train_1b_$1.err"
  say "1B $1 rc $? $(grep -m1 -i 'error' "$out/train_1b_$1.err")"
  python3 bench/device_calls/train_summary.py "$out/train_1b_$1.jsonl" "$1" attention products swiglu rope norms lm_head step | tee -a "$out/summary.txt"
}
train1b none_32k 32768 none
train1b attention_32k 32768 attention
train1b none_32k_again 32768 none
train1b none_64k 65536 none
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
