#!/usr/bin/env bash
# One call on 4 GPUs (session q, 2026-11-28), issue 35, when a 4-GPU kind is lent:
#  1. `seqpar probe` on the 4 GPUs (fits its own shard-step factors); `auto` runs on that file
#  2. 16K tokens a GPU (S = 64K), GQA 32:8 and MHA, causal: auto and the fastest families with the
#     one-GPU kernel measured on every GPU (issue 35's bar: 0.85 of it, 1.15x PyTorch), and PyTorch
#     context parallel in the same call
#  3. Ulysses' peak at 256K GQA 32:8 since it receives into the joined spans (e94d379): validation.md
#     had ulysses and ulysses-ring at -11% (the stream arena's holes); ulysses-overlap beside it
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-420}
source bench/device_calls/call_start.sh 64 "seqpar_cli bench_gpu_ring"
gpus=$(nvidia-smi -L | wc -l)
timeout 120 ./build-gpu/seqpar probe --device cuda --gpus $gpus --out "$out/probe_4gpu_fitted.json" > "$out/probe.log" 2>&1
say "probe rc $? $(grep -i 'shard_step' "$out/probe.log" | head -n 2 | tr '\n' ' ')"
[ -s "$out/probe_4gpu_fitted.json" ] && { export SEQPAR_CLUSTER="$out/probe_4gpu_fitted.json"; cp "$SEQPAR_CLUSTER" "$out/probe_4gpu_fitted.txt"; }
matrix() {  # kv_heads seqs tag algos [extra bench flags]
  local l=$(left); [ $l -lt 35 ] && { say "out of time before $3"; return 9; }
  timeout $(( l - 20 < ${CAP:-60} ? l - 20 : ${CAP:-60} )) ./build-gpu/bench_gpu_ring --seqs $2 --mask causal --layout zigzag \
    --algos $4 --heads 32 --kv-heads $1 --head-dim 128 ${5:-} >> "$out/matrix_$3.jsonl" 2>> "$out/matrix_$3.err"
  say "$3 rc $? $(grep -c seqpar_ring "$out/matrix_$3.jsonl") lines"
}
peer() {  # tag seqs kv_heads
  local l=$(left); [ $l -lt 50 ] && { say "out of time before peer $1"; return 9; }
  local cap=$(( l - 20 < 90 ? l - 20 : 90 ))
  timeout $cap torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py --seqs $2 --kv-heads $3 \
    --max-seconds $(( cap - 25 )) >> "$out/peer_cp_$1.jsonl" 2>> "$out/peer_cp_$1.err"
  say "peer $1 rc $? $(grep -c fwdbwd_ms "$out/peer_cp_$1.jsonl") lines"
}
top=auto,ulysses-overlap,ulysses,ring-return,burst-return
CAP=50 matrix 8 65536 gqa_causal_64k $top "--single-max 65536 --rounds 2"
CAP=50 matrix 32 65536 mha_causal_64k $top "--single-max 65536 --rounds 2"
peer small 65536 8
peer small_mha 65536 32
CAP=70 matrix 8 262144 gqa_causal_256k auto,ulysses,ulysses-overlap,ulysses-ring "--single-max 0 --rounds 1"
python3 bench/device_calls/matrix_summary.py "$out" | tee -a "$out/summary.txt"
grep -h '^{' "$out"/peer_cp_*.jsonl 2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if 'fwdbwd_ms' in r: print('PyTorch CP', 'kv', r.get('kv_heads'), 'S', r.get('seq'), round(r['fwdbwd_ms'], 2), 'ms')" | tee -a "$out/summary.txt"
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
