#!/usr/bin/env bash
# The last call on 4 GPUs (session o, 2026-11-28), after the 8B run (h200x4_o2_8b_1m.sh), in the
# time it leaves:
#  1. issue 36: the 1B preset at 64K on the four GPUs, ours (attention checkpointing) and PyTorch's
#     peer (FSDP2 + context parallel, selective checkpointing, compile) on the same text, 4 steps
#  2. issues 34/35: 64 documents (the documents layout) at 256K and 512K, and a 4K window at 256K,
#     GQA 32:8: `auto` on the probed cluster (call o1's, kept in /tmp/o_keep) against the families
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-560}
source bench/device_calls/call_start.sh 64 "seqpar_cli bench_gpu_ring"
[ -s /tmp/o_keep/probe_4gpu.json ] && export SEQPAR_CLUSTER=/tmp/o_keep/probe_4gpu.json
gpus=$(nvidia-smi -L | wc -l)
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
l=$(left); [ $l -gt 60 ] && { timeout $(( l - 25 < 100 ? l - 25 : 100 )) ./build-gpu/seqpar train --device cuda --gpus $gpus \
  --model 1b --data "text:$txt" --seq 65536 --batch 1 --steps 4 --warmup 1 --checkpointing attention --profile --json \
  > "$out/ours_1b_64k.jsonl" 2> "$out/ours_1b_64k.err"
  say "ours 1B 64K rc $? $(tail -n 1 "$out/ours_1b_64k.jsonl" | head -c 1200) $(grep -m1 -i 'error' "$out/ours_1b_64k.err")"; }
l=$(left); [ $l -gt 70 ] && { timeout $(( l - 25 < 150 ? l - 25 : 150 )) torchrun --standalone --nproc_per_node=$gpus \
  bench/torch_train_peer.py --seqs 65536 --steps 4 --data $txt > "$out/peer_1b_64k.jsonl" 2> "$out/peer_1b_64k.err"
  say "peer 1B 64K rc $? $(grep '^{' "$out/peer_1b_64k.jsonl" | tail -n 1 | head -c 500) $(grep -m1 -i 'error' "$out/peer_1b_64k.err")"; }
matrix() {  # mask layout seqs tag algos
  local l=$(left); [ $l -lt 35 ] && { say "out of time before $4"; return 9; }
  timeout $(( l - 20 < ${CAP:-90} ? l - 20 : ${CAP:-90} )) ./build-gpu/bench_gpu_ring --seqs $3 --mask $1 --layout $2 \
    --algos $5 --heads 32 --kv-heads 8 --head-dim 128 --single-max 0 --rounds 1 >> "$out/matrix_$4.jsonl" 2>> "$out/matrix_$4.err"
  say "$4 rc $? $(grep -c seqpar_ring "$out/matrix_$4.jsonl") lines"
}
CAP=80 matrix docs:64 documents 262144,524288 gqa_docs64 auto,ulysses,ulysses-overlap,ring-return,burst-return
CAP=80 matrix window:4096,0 zigzag 262144 gqa_window4k auto,ulysses,ulysses-overlap,ring-return,burst-return,distflash
python3 bench/device_calls/matrix_summary.py "$out" | tee -a "$out/summary.txt"
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
