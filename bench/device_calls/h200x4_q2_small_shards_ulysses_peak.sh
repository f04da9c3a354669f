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
top=auto,ulysses-overlap,ulysses,ring-return,burst-return
CAP=50 matrix 8 causal zigzag 65536 gqa_causal_64k $top "--single-max 65536 --rounds 2"
CAP=50 matrix 32 causal zigzag 65536 mha_causal_64k $top "--single-max 65536 --rounds 2"
peer small 65536 8
peer small_mha 65536 32
CAP=70 matrix 8 causal zigzag 262144 gqa_causal_256k auto,ulysses,ulysses-overlap,ulysses-ring
python3 bench/device_calls/matrix_summary.py "$out" | tee -a "$out/summary.txt"
grep -h '^{' "$out"/peer_cp_*.jsonl 2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if 'fwdbwd_ms' in r: print('PyTorch CP', 'kv', r.get('kv_heads'), 'S', r.get('seq'), round(r['fwdbwd_ms'], 2), 'ms')" | tee -a "$out/summary.txt"
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
