#!/usr/bin/env bash
# One call on 1 GPU (session u, 2026-11-29), issue 34: the backend's kernels as the library runs
# them (bench_gpu_attention through the backend interface: the cluster forward routed again at
# D = 128 dense 8K-64K, c8d23b0) against PyTorch's cuDNN SDPA in the same call
# (bench/torch_sdpa_peer.py, dO uniform [-1, 1) as ours), forward alone and forward + backward,
# 8K-128K, causal and full: D = 128 at 32:32 and 32:8, D = 64 at 32:8. First test_backends in 4
# shards (HopperBackend.ClusterForwardMeetsTheRuleAt16K, the fixed test, on the routed kernel).
# Session w's call w7 reran it on its routing: SEQS=8192,131072 CELLS="d128_gqa:128:8 d64_gqa:64:8".
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 16 "test_backends bench_gpu_attention"
shards test_backends 4 100
grep -h 'ClusterForward\|DenseForward' "$out"/test_backends_*.log | head -4 >> "$out/summary.txt"
seqs=${SEQS:-8192,16384,32768,65536,131072}
cell() {  # cell TAG D HKV: ours (hopper, and our cudnn backend) then the peer, into $out/{ours,peer}_TAG.jsonl
  local l=$(left); [ $l -lt 60 ] && { say "out of time before $1"; return 9; }
  timeout $(( l / 2 < 120 ? l / 2 : 120 )) ./build-gpu/bench_gpu_attention --backends hopper,cudnn --seqs $seqs \
    --heads 32 --kv-heads $3 --head-dim $2 --json > "$out/ours_$1.jsonl" 2> "$out/ours_$1.err"
  say "ours $1 rc $? $(grep -c '^{' "$out/ours_$1.jsonl") lines"
  l=$(left); timeout $(( l - 10 < 120 ? l - 10 : 120 )) python3 bench/torch_sdpa_peer.py --backends cudnn --seqs $seqs \
    --heads 32 --kv-heads $3 --dim $2 > "$out/peer_$1.jsonl" 2> "$out/peer_$1.err"
  say "peer $1 rc $? $(grep -c fwd_ms "$out/peer_$1.jsonl") lines"
  python3 bench/compare_kernels.py "$out/ours_$1.jsonl" "$out/peer_$1.jsonl" | head -26 >> "$out/summary.txt"
}
for c in ${CELLS:-d128_mha:128:32 d128_gqa:128:8 d64_gqa:64:8}; do cell ${c//:/ }; done
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
