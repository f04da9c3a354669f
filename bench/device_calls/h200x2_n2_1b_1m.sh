#!/usr/bin/env bash
# One call on 2 GPUs (session n, 2026-11-28), issue 36 item 4: the 1B preset at 1M tokens on two
# GPUs (512K a GPU, the per-GPU load of the issue's 2M on four), one step: attention
# checkpointing with the checkpoints offloaded to host memory, ZeRO-3, the MLP and the mixer's
# backward tiled (--tile-tokens -1), the peak device memory and the step's parts. One step is
# about 16x the 256K step's attention (18 s at 256K in call m3): about 5 minutes.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-520}
source bench/device_calls/call_start.sh 32 "seqpar_cli"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
( while sleep 20; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ' >> "$out/smi.log";
    free -g | awk '/Mem/ {print " host used " $3 " GiB"}' >> "$out/smi.log"; done ) & smi=$!
l=$(left)
timeout $(( l - 15 )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 1b --data "text:$txt" --seq 1048576 \
  --batch 1 --steps 1 --warmup 1 --checkpointing attention --offload-checkpoints --zero 3 --tile-tokens -1 --json \
  > "$out/train_1b_1m.jsonl" 2> "$out/train_1b_1m.err"
say "1B 1M rc $? $(tail -n 1 "$out/train_1b_1m.jsonl" | head -c 1500) $(grep -m2 -i 'error\|out of memory' "$out/train_1b_1m.err")"
kill $smi 2>/dev/null
tail -n 4 "$out/smi.log" >> "$out/summary.txt"
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
