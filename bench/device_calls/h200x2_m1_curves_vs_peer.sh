#!/usr/bin/env bash
# One call on 2 GPUs (session m, 2026-11-28): the 1B preset's loss curve against PyTorch's peer
# from the same starting weights on the same batches (issue 36), and the GPU tests of what the
# last session changed without running them together (the persistent forward beside auto's
# cuDNN backward at D = 64; the step profile after its review).
#  1. build; GPU 0 test_backends, GPU 1 GpuTrain.*
#  2. both GPUs: ours, 200 steps at 16K with --dump; the peer replaying that dump (FSDP2 +
#     context parallel, torch.compile, selective checkpointing); then ours on one GPU as the
#     yardstick (only the reduction order and the schedule change); bench/train_curves.py
#  3. the 8B preset on both GPUs at 64K with --profile, in the time left
set -u
CALL_BUDGET_S=570
source bench/device_calls/call_start.sh 32 "seqpar_cli test_backends test_gpu_train"
( CUDA_VISIBLE_DEVICES=0 timeout 150 ./build-gpu/tests/test_backends > "$out/backends.log" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8 timeout 150 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.*' > "$out/gpu_train.log" 2>&1 ) &
wait
for f in backends gpu_train; do
  say "$f: $(grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED|Failure|tests ran' "$out/$f.log" | head -8 | tr '\n' ' ')"
done
curve=(--device cuda --model 1b --data text:README.md --seq 16384 --batch 1 --steps 200 --warmup 20 --lr 3e-4
       --checkpointing attention --json)
rm -rf /tmp/replay
timeout 160 ./build-gpu/seqpar train "${curve[@]}" --gpus 2 --dump /tmp/replay > "$out/curve_ours_2gpu.jsonl" 2> "$out/curve_ours_2gpu.err"
say "ours 2 GPUs rc $? $(tail -n 1 "$out/curve_ours_2gpu.jsonl" | head -c 300)"
l=$(left); timeout $(( l - 120 < 200 ? l - 120 : 200 )) torchrun --standalone --nproc_per_node=2 bench/torch_train_peer.py \
  --replay /tmp/replay > "$out/curve_peer_2gpu.jsonl" 2> "$out/curve_peer_2gpu.err"
say "peer rc $? $(grep '^{' "$out/curve_peer_2gpu.jsonl" | tail -n 1 | head -c 300) $(grep -m1 -i 'error' "$out/curve_peer_2gpu.err")"
l=$(left); CUDA_VISIBLE_DEVICES=0 timeout $(( l - 20 < 150 ? l - 20 : 150 )) ./build-gpu/seqpar train "${curve[@]}" \
  > "$out/curve_ours_1gpu.jsonl" 2> "$out/curve_ours_1gpu.err"
say "ours 1 GPU rc $? $(tail -n 1 "$out/curve_ours_1gpu.jsonl" | head -c 300)"
python3 bench/train_curves.py "$out/curve_ours_2gpu.jsonl" "$out/curve_peer_2gpu.jsonl" \
  --yardstick "$out/curve_ours_1gpu.jsonl" --names "seqpar 2 GPUs,PyTorch FSDP2 + CP 2 GPUs" \
  --plot "$out/curves_1b_ours_vs_peer.svg" --title "1B preset, S = 16K, 200 steps: seqpar vs PyTorch (same weights, batches)" \
  2>&1 | tee -a "$out/summary.txt"
l=$(left); [ $l -gt 90 ] && { timeout $(( l - 15 )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 8b --zero 3 \
  --data text:README.md --seq 65536 --batch 1 --steps 4 --warmup 10 --lr 3e-5 --checkpointing attention --profile --json \
  > "$out/train_8b_64k.jsonl" 2> "$out/train_8b_64k.err"
  say "8B 64K rc $? $(tail -n 1 "$out/train_8b_64k.jsonl" | head -c 900) $(grep -m1 -i 'error' "$out/train_8b_64k.err")"; }
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
