#!/usr/bin/env bash
# One call on 2 GPUs (session m, 2026-11-28): the Hopper D = 64 backward with 128-row query tiles
# (q128, a155b15) in training. The 1B preset's heads are 64 wide and attention was 69% of its
# step at 64K (session l), on the 64-row kernel and then cuDNN's backward.
#  1. build; GPU 0 test_backends, GPU 1 GpuTrain.* (the trainer through the new backward)
#  2. both GPUs: the 1B preset at 64K with --profile; PyTorch's peer at 64K (the same text);
#     the 1B preset at 256K in the time left
set -u
CALL_BUDGET_S=390
source bench/device_calls/call_start.sh 32 "seqpar_cli test_backends test_gpu_train"
( CUDA_VISIBLE_DEVICES=0 timeout 90 ./build-gpu/tests/test_backends > "$out/backends.log" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8 timeout 90 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.*' > "$out/gpu_train.log" 2>&1 ) &
wait
for f in backends gpu_train; do
  say "$f: $(grep -E '^\[  (PASSED|FAILED)|Failure|tests ran' "$out/$f.log" | head -6 | tr '\n' ' ')"
done
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train() {  # seq tag [extra...]
  local S=$1 tag=$2; shift 2
  local l=$(left); [ $l -lt 45 ] && { say "out of time before $tag"; return 9; }
  timeout $(( l - 10 < ${CAP:-80} ? l - 10 : ${CAP:-80} )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 1b \
    --data "text:$txt" --seq $S --batch 1 --steps ${STEPS:-4} --warmup 1 --checkpointing attention --json "$@" \
    > "$out/$tag.jsonl" 2> "$out/$tag.err"
  local rc=$?; say "$tag rc $rc $(tail -n 1 "$out/$tag.jsonl" | head -c 900) $(grep -m1 -i 'error' "$out/$tag.err")"
}
train 65536 ours_64k_profile --profile
l=$(left); [ $l -gt 70 ] && { timeout $(( l - 10 < 150 ? l - 10 : 150 )) torchrun --standalone --nproc_per_node=2 \
  bench/torch_train_peer.py --seqs 65536 --steps 4 --data $txt > "$out/peer_64k.jsonl" 2> "$out/peer_64k.err"
  say "peer 64K rc $? $(grep '^{' "$out/peer_64k.jsonl" | tail -n 1 | head -c 400) $(grep -m1 -i 'error' "$out/peer_64k.err")"; }
CAP=100 STEPS=3 train 262144 ours_256k_profile --profile
say end
pack
