#!/usr/bin/env bash
# A call on 4 GPUs (session p, 2026-11-28), after the 8B run (h200x4_o2_8b_1m.sh) on the same machine:
#  1. issue 35: `seqpar probe` on the 4 GPUs, now with its timed ring-return pass that fits the
#     shard-step factors (its first run on GPUs); then `auto` on that file, out of sample, against
#     the fastest families: causal GQA 32:8 at 64K / 256K / 512K, MHA at 256K
#  2. issue 36: the 1B preset at 64K, ours (attention checkpointing) and PyTorch's peer (FSDP2 +
#     context parallel, selective checkpointing, compile) on the same text, 4 steps, same call
#     (RUN_TRAIN=0 leaves it out: the 8B run left this session too little time)
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-585}
source bench/device_calls/call_start.sh 64 "seqpar_cli bench_gpu_ring"
gpus=$(nvidia-smi -L | wc -l)
timeout 150 ./build-gpu/seqpar probe --device cuda --gpus $gpus --out "$out/probe_4gpu_fitted.json" > "$out/probe.log" 2>&1
say "probe rc $? $(grep -i 'shard\|factor' "$out/probe.log" | head -n 4 | tr '\n' ' ')"
[ -s "$out/probe_4gpu_fitted.json" ] && { export SEQPAR_CLUSTER="$out/probe_4gpu_fitted.json"
  python3 -c "import json,sys; print('shard_step_factor', json.load(open(sys.argv[1])).get('shard_step_factor'))" \
    "$SEQPAR_CLUSTER" | tee -a "$out/summary.txt"; }
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
l=$(left); [ ${RUN_TRAIN:-1} = 1 ] && [ $l -gt 60 ] && { timeout $(( l - 25 < 90 ? l - 25 : 90 )) ./build-gpu/seqpar train --device cuda --gpus $gpus \
  --model 1b --data "text:$txt" --seq 65536 --batch 1 --steps 4 --warmup 1 --checkpointing attention --profile --json \
  > "$out/ours_1b_64k.jsonl" 2> "$out/ours_1b_64k.err"
  say "ours 1B 64K rc $? $(tail -n 1 "$out/ours_1b_64k.jsonl" | head -c 600) $(grep -m1 -i 'error' "$out/ours_1b_64k.err")"; }
l=$(left); [ ${RUN_TRAIN:-1} = 1 ] && [ $l -gt 70 ] && { timeout $(( l - 25 < 140 ? l - 25 : 140 )) torchrun --standalone --nproc_per_node=$gpus \
  bench/torch_train_peer.py --seqs 65536 --steps 4 --data $txt > "$out/peer_1b_64k.jsonl" 2> "$out/peer_1b_64k.err"
  say "peer 1B 64K rc $? $(grep '^{' "$out/peer_1b_64k.jsonl" | tail -n 1 | head -c 500) $(grep -m1 -i 'error' "$out/peer_1b_64k.err")"; }
matrix() {  # kv_heads seqs tag algos
  local l=$(left); [ $l -lt 35 ] && { say "out of time before $3"; return 9; }
  timeout $(( l - 20 < ${CAP:-90} ? l - 20 : ${CAP:-90} )) ./build-gpu/bench_gpu_ring --seqs $2 --mask causal --layout zigzag \
    --algos $4 --heads 32 --kv-heads $1 --head-dim 128 --single-max 0 --rounds 1 >> "$out/matrix_$3.jsonl" 2>> "$out/matrix_$3.err"
  say "$3 rc $? $(grep -c seqpar_ring "$out/matrix_$3.jsonl") lines"
}
top=auto,ulysses-overlap,ulysses,ulysses-ring,ring-return,burst-return
CAP=90 matrix 8 ${GQA_SEQS:-65536,262144} gqa_causal $top
CAP=90 matrix 8 524288 gqa_causal_512k auto,ulysses-overlap,ulysses,ring-return
CAP=80 matrix 32 262144 mha_causal_256k auto,ulysses-overlap,ulysses,ring-return,burst-return
python3 bench/device_calls/matrix_summary.py "$out" | tee -a "$out/summary.txt"
say end
cp "$out/probe_4gpu_fitted.json" "$out/probe_4gpu_fitted.txt" 2>/dev/null
PACK_GLOBS="*.jsonl *.err *.log" pack
