#!/usr/bin/env bash
# One call on 2 GPUs (session l, 2026-11-28): where the 1B preset's training step goes (issue 36,
# item 1), by `seqpar train --profile` (an event pair around each device op on the pass's stream),
# beside PyTorch's FSDP2 + context-parallel peer on the same text in the same call.
#  1. build; the profile's GPU test (GpuTrain.ProfileTimesTheStepWithoutChangingIt)
#  2. both GPUs: ours at 64K with --profile, without it (its cost), with 4,096-row LM head chunks;
#     the peer at 64K; ours at 256K with --profile; the peer at 128K in the time left
set -u
CALL_BUDGET_S=560
source bench/device_calls/call_start.sh 32 "seqpar_cli test_gpu_train"
CUDA_VISIBLE_DEVICES=0 timeout 90 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.Profile*' > "$out/gpu_train_profile.log" 2>&1
say "profile test: $(grep -E '^\[  (PASSED|FAILED)|Failure|Expected|Which is' "$out/gpu_train_profile.log" | head -8 | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train() {  # seq tag [extra...]
  local S=$1 tag=$2; shift 2
  local l=$(left); [ $l -lt 45 ] && { say "out of time before $tag"; return 9; }
  timeout $(( l - 25 < ${CAP:-100} ? l - 25 : ${CAP:-100} )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 1b \
    --data "text:$txt" --seq $S --batch 1 --steps ${STEPS:-4} --warmup 1 --checkpointing attention --json "$@" \
    > "$out/$tag.jsonl" 2> "$out/$tag.err"
  local rc=$?; say "$tag rc $rc $(tail -n 1 "$out/$tag.jsonl" | head -c 900) $(grep -m1 -i 'error' "$out/$tag.err")"
}
peer() {  # seq tag
  local l=$(left); [ $l -lt 60 ] && { say "out of time before $2"; return 9; }
  timeout $(( l - 20 < 170 ? l - 20 : 170 )) torchrun --standalone --nproc_per_node=2 bench/torch_train_peer.py --seqs $1 \
    --steps 4 --data $txt > "$out/$2.jsonl" 2> "$out/$2.err"
  say "$2 rc $? $(grep '^{' "$out/$2.jsonl" | tail -n 1 | head -c 400) $(grep -m1 -i 'error' "$out/$2.err")"
}
train 65536 ours_64k_profile --profile
train 65536 ours_64k
peer 65536 peer_64k
train 65536 ours_64k_profile_chunk4096 --profile --lm-head-chunk 4096
CAP=150 STEPS=3 train 262144 ours_256k_profile --profile
peer 131072 peer_128k
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ours_*profile*.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    if not rows: continue
    w = rows[-1].get("work_ms", {}); step = w.get("step", 0) or 1
    print(os.path.basename(f), f"{rows[-1]['tokens_per_s']:.0f} tok/s", ", ".join(f"{k} {v:.1f} ({100 * v / step:.1f}%)" for k, v in w.items()))
PY
say end
pack
