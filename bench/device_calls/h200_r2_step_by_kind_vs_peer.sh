#!/usr/bin/env bash
# One call on 1 GPU (session r, 2026-11-29), issue 36 item 1: where the 1B's step goes, ours and
# PyTorch's peer side by side, same call, same text, 32K tokens (the peer's largest on one H200:
# 64K ran out of memory in call r1). Ours: `seqpar train --profile` (each op timed by an event
# pair); the peer: one extra step under PyTorch's profiler, its kernels put in the same kinds
# (bench/peer_step_profile.py). Then the 1B at 128K with nothing but the MLP recomputed
# (--checkpointing none --tile-tokens 8192: the tiled MLP keeps no gate/up and remakes them tile
# by tile) against call r1's attention policy (44.2% MFU, which re-runs every product).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-400}
source bench/device_calls/call_start.sh 16 "seqpar_cli"
train_text
KINDS="attention products swiglu rope norms lm_head step"
train1b none_32k 32768 4 --checkpointing none
l=$(left); [ $l -gt 120 ] && { timeout $(( l - 100 < 150 ? l - 100 : 150 )) torchrun --standalone --nproc_per_node=1 \
  bench/torch_train_peer.py --seqs 32768 --steps 4 --data $txt --profile > "$out/peer_1b_32k.jsonl" 2> "$out/peer_1b_32k.err"
  say "peer 1B 32K rc $? $(grep -m1 -i 'error' "$out/peer_1b_32k.err" | head -c 300)"
  grep '^{' "$out/peer_1b_32k.jsonl" | tail -3 | cut -c1-1500 >> "$out/summary.txt"; }
train1b none_tiled_128k 131072 3 --checkpointing none --tile-tokens 8192
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
