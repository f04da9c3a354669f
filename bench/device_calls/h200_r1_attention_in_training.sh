#!/usr/bin/env bash
# One call on 1 GPU (session r, 2026-11-29), issue 36: why the 1B's attention runs at about 475
# TFLOP/s inside a training step (call q6: 2071 ms of a 64K step) when the Hopper kernels' A/B
# gives about 530 (D = 64 backward, causal 32:8) and more forward. Same shape everywhere (H = 32,
# K/V heads 8, D = 64, causal, B = 1): (1) the backend alone, forward and backward timed apart
# (`seqpar probe --backends hopper`); (2) the same through the Session at one rank, step
# milestones traced (bench_gpu_ring --gpus 1 --trace); (3) the 1B step at 64K with --profile;
# (4) the 1B at 128K with attention checkpointing (MFU at 128K on one GPU); (5) PyTorch's peer
# at 64K on the one GPU, if time is left (at 32K it held 86.9 GiB).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 16 "seqpar_cli bench_gpu_ring"
timeout 90 ./build-gpu/seqpar probe --device cuda --gpus 1 --backends hopper --heads 32 --kv-heads 8 --head-dim 64 \
  --tokens 32768 65536 --masks causal --schedule-tokens -1 --out "$out/probe_d64.json" > "$out/probe_d64.log" 2>&1
say "probe d64 rc $?"; grep -i "tflop\|attention" "$out/probe_d64.log" | head -20 | tee -a "$out/summary.txt"
timeout 90 ./build-gpu/bench_gpu_ring --gpus 1 --algos auto --heads 32 --kv-heads 8 --head-dim 64 --seqs 32768,65536 \
  --mask causal --single-max 0 --rounds 3 --trace > "$out/ring_p1_d64.jsonl" 2> "$out/ring_p1_d64.err"
say "session P=1 rc $?"; grep -v '^{' "$out/ring_p1_d64.jsonl" | head -40 >> "$out/summary.txt"
python3 - "$out/ring_p1_d64.jsonl" <<'PY' | tee -a "$out/summary.txt"
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{") and "seqpar_ring" in l:
        r = json.loads(l); print({k: r[k] for k in r if k in ("seq", "algo", "ran", "fwd_ms", "fwdbwd_ms", "fwd_tflops_per_gpu", "fwdbwd_tflops_per_gpu", "head_groups", "backend_calls_per_iter_rank0", "peak_extra_GiB")})
PY
train_text
KINDS="attention products swiglu rope norms lm_head step"
train1b none_64k 65536 4 --checkpointing none
train1b attention_128k 131072 3 --checkpointing attention
l=$(left); [ $l -gt 100 ] && { timeout $(( l - 15 )) torchrun --standalone --nproc_per_node=1 bench/torch_train_peer.py \
  --seqs 65536 --steps 4 --data $txt > "$out/peer_1b_64k.jsonl" 2> "$out/peer_1b_64k.err"
  say "peer 1B 64K rc $? $(grep -m1 -i 'error\|out of memory' "$out/peer_1b_64k.err" | head -c 300)"
  grep '^{' "$out/peer_1b_64k.jsonl" | tail -2 >> "$out/summary.txt"; }
say end
PACK_GLOBS="*.jsonl *.err *.log *.json" pack
