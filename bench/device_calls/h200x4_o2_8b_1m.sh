#!/usr/bin/env bash
# Calls on 4 GPUs (session o, 2026-11-28), issue 36 item 3/4: the 8B preset (Llama-3-8B's shape,
# vocabulary 128256) at 1M tokens on four GPUs (256K a GPU), one step: ZeRO-3, full checkpointing
# (x_in alone kept, 4 GiB a layer a GPU), offloaded to pinned host memory but the last 8 layers
# (24 layers x 4 GiB x 4 ranks = 384 GiB of the 512 GiB host; docs/MEMORY.md's estimate: about
# 80 + 6 x 4 = 104 GiB a GPU), the MLP tiled. One step is longer than one call (about 11-12 min
# predicted), so the first call starts it in a session of its own (setsid: it outlives the call
# while the machine stays held) and every call, this script again, waits for it and reports.
# Session p ran it again with --progress 60 (rank 0's phase and layers every minute, in train.err).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-585}
source bench/device_calls/call_start.sh 64 "seqpar_cli"
run=/tmp/o_8b; mkdir -p $run
if [ ! -e $run/started ]; then
  date +%s > $run/started
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 128256, 1 << 21, dtype=np.uint32).tofile('$run/tokens.u32')"
  setsid nohup bash -c "while sleep 15; do echo \"\$(date +%T) \$(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ') host used \$(free -g | awk '/Mem/ {print \$3}') GiB\"; done" \
    > $run/smi.log 2>&1 < /dev/null &
  echo $! > $run/smi.pid
  setsid nohup bash -c "./build-gpu/seqpar train --device cuda --gpus 4 --model 8b --data tokens:$run/tokens.u32:u32 \
      --seq 1048576 --batch 1 --steps 1 --warmup 1 --checkpointing full --offload-checkpoints --offload-keep-layers 8 \
      --zero 3 --tile-tokens -1 --profile --progress 60 --json > $run/train.jsonl 2> $run/train.err; echo \$? > $run/rc" < /dev/null > /dev/null 2>&1 &
  say "8B 1M started"
fi
while [ ! -e $run/rc ] && [ "$(left)" -gt 12 ]; do sleep 5; done
say "8B 1M after $(( $(date +%s) - $(cat $run/started) )) s: rc $(cat $run/rc 2>/dev/null || echo running)"
say "$(tail -n 1 $run/train.jsonl 2>/dev/null | head -c 2500) $(grep -m3 -i 'error\|out of memory' $run/train.err)"
tail -n 4 $run/train.err >> "$out/summary.txt"
tail -n 3 $run/smi.log >> "$out/summary.txt"
[ -e $run/rc ] && kill "$(cat $run/smi.pid)" 2>/dev/null
cp $run/train.jsonl $run/train.err $run/smi.log "$out/" 2>/dev/null
say end
