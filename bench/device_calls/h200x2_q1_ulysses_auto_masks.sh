#!/usr/bin/env bash
# One call on 2 GPUs (session q, 2026-11-28):
#  1. issue 35: Ulysses receives the all-to-all's pieces straight into the spans they join (e94d379,
#     written without a GPU): its GPU cases of test_gpu_schedules (thread ranks sharing a GPU, and
#     NCCL over both GPUs), then MHA 256K Ulysses / ulysses-overlap against call n1's same runs
#     (peak and speed: the change sends ~40 smaller messages a peer instead of 6)
#  2. issue 35: `seqpar probe` on both GPUs (fits its own shard-step factors), then `auto` on that
#     file against every algorithm at causal GQA 64K, MHA 16K, a 4K window at 256K and 64
#     documents at 256K (the 2-GPU cells with windows and documents had no current rows)
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-470}
source bench/device_calls/call_start.sh 32 "seqpar_cli bench_gpu_ring test_gpu_schedules"
OMP_NUM_THREADS=8 timeout 120 ./build-gpu/tests/test_gpu_schedules --gtest_filter='*lysses*' > "$out/gpu_ulysses.log" 2>&1
say "gpu ulysses rc $?: $(grep -c '^\[       OK' "$out/gpu_ulysses.log") ok, $(grep -c '^\[  FAILED  \]' "$out/gpu_ulysses.log") failed lines; $(grep -E '^\[  (PASSED|FAILED)|tests ran' "$out/gpu_ulysses.log" | head -3 | tr '\n' ' ')"
timeout 120 ./build-gpu/seqpar probe --device cuda --gpus 2 --out "$out/probe_2gpu_fitted.json" > "$out/probe.log" 2>&1
say "probe rc $? $(grep -i 'shard\|factor' "$out/probe.log" | head -n 4 | tr '\n' ' ')"
[ -s "$out/probe_2gpu_fitted.json" ] && { export SEQPAR_CLUSTER="$out/probe_2gpu_fitted.json"; cp "$SEQPAR_CLUSTER" "$out/probe_2gpu_fitted.txt"; }
matrix() {  # kv_heads mask layout seqs tag algos
  local l=$(left); [ $l -lt 35 ] && { say "out of time before $5"; return 9; }
  timeout $(( l - 20 < ${CAP:-60} ? l - 20 : ${CAP:-60} )) ./build-gpu/bench_gpu_ring --seqs $4 --mask $2 --layout $3 --algos $6 \
    --heads 32 --kv-heads $1 --head-dim 128 --single-max 0 --rounds 1 >> "$out/matrix_$5.jsonl" 2>> "$out/matrix_$5.err"
  say "$5 rc $? $(grep -c seqpar_ring "$out/matrix_$5.jsonl") lines"
}
all=auto,ulysses-overlap,ulysses,ring-return,burst-return,ring,burst,distflash
CAP=70 matrix 32 causal zigzag 262144 mha_causal_256k auto,ulysses,ulysses-overlap,ring-return
CAP=50 matrix 8 causal zigzag 65536 gqa_causal_64k $all
CAP=40 matrix 32 causal zigzag 16384 mha_causal_16k $all
CAP=60 matrix 8 window:4096,0 zigzag 262144 gqa_window4k_256k $all
CAP=60 matrix 8 docs:64 documents 262144 gqa_docs64_256k $all
python3 bench/device_calls/matrix_summary.py "$out" | tee -a "$out/summary.txt"
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
