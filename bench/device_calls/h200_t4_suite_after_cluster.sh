#!/usr/bin/env bash
# One call on 1 GPU (session t, 2026-11-29), issues 34 and 36: the GPU tests of what session t
# changed in the library. test_backends (every backend against the fp64 oracle, 4 shards at once;
# with HopperBackend.ClusterForwardMeetsTheRuleAt16K, the forward's 2-CTA cluster kernel through
# the backend, routed from 8K keys at D = 128 by 93c23dc, and both backward kernels' dQ stores,
# d43198e) and test_model_cuda (the tuned cuBLASLt products' bits, the LM head's vector loss
# kernel); the 1B preset at 32K tokens (`--checkpointing none`, the tuned products) beside
# PyTorch's FSDP2 peer (as call s1); then test_gpu_attention with the time left.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-330}
source bench/device_calls/call_start.sh 16 "test_backends test_model_cuda test_gpu_attention seqpar_cli"
shards test_backends 4 90
grep -h 'ClusterForward' "$out"/test_backends_*.log | head -3 >> "$out/summary.txt"
suite test_model_cuda 30
train1b 32k_none 32768 6 --checkpointing none
l=$(left); [ $l -gt 140 ] && { timeout 130 torchrun --standalone --nproc_per_node=1 bench/torch_train_peer.py --seqs 32768 \
  --steps 4 --data $txt --profile > "$out/peer_1b_32k.jsonl" 2> "$out/peer_1b_32k.err"
  say "peer 1B 32K rc $? $(grep -m1 -i 'error' "$out/peer_1b_32k.err" | head -c 300)"
  grep '^{' "$out/peer_1b_32k.jsonl" | tail -2 | cut -c1-1200 >> "$out/summary.txt"; }
suite test_gpu_attention 600
say end
PACK_GLOBS="*.log *.err" pack
