#!/usr/bin/env bash
# One call on 1 GPU (session q, 2026-11-28), issue 36: what the 1B preset's recompute costs. With
# --checkpointing attention the backward re-runs every layer's forward but the attention (norms,
# projections, RoPE, MLP); with none it re-runs nothing, for more memory. The 1B preset at 32K
# tokens (a GPU's share of 64K on two), none / attention / none, then none at 64K (128K on two).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-260}
source bench/device_calls/call_start.sh 16 "seqpar_cli"
train_text
KINDS="attention products swiglu rope norms lm_head step"
train1b none_32k 32768 4 --checkpointing none
train1b attention_32k 32768 4 --checkpointing attention
train1b none_32k_again 32768 4 --checkpointing none
train1b none_64k 65536 4 --checkpointing none
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
