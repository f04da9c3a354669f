#!/usr/bin/env bash
# One call on 1 GPU (session q, 2026-11-28), issue 36: what the 1B preset's recompute costs. With
# --checkpointing attention the backward re-runs every layer's forward but the attention (norms,
# projections, RoPE, MLP); with none it re-runs nothing, for more memory. The 1B preset at 32K
# tokens (a GPU's share of 64K on two), none / attention / none, then none at 64K (128K on two).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-260}
source bench/device_calls/call_start.sh 16 "seqpar_cli"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train1b() {  # tag seq policy
  local l=$(left); [ $l -lt 40 ] && { say "out of time before 1B $1"; return 9; }
  timeout $(( l - 10 < 60 ? l - 10 : 60 )) ./build-gpu/seqpar train --device cuda --gpus 1 --model 1b --data "text:$txt" \
    --seq $2 --batch 1 --steps 4 --warmup 1 --checkpointing $3 --profile --json \
    > "$out/train_1b_$1.jsonl" 2> "$out/train_1b_$1.err"
  say "1B $1 rc $? $(grep -m1 -i 'error' "$out/train_1b_$1.err")"
  python3 - "$out/train_1b_$1.jsonl" "$1" <<'PY' | tee -a "$out/summary.txt"
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    r = json.loads(l)
    if "step" not in r: continue
    w = r.get("work_ms", {})
    print(sys.argv[2], "step", r["step"], "tokens/s %.0f" % r.get("tokens_per_s", 0), "mfu %.4f" % r.get("mfu_989", 0),
          "peak GiB %.1f" % (r.get("device_peak_bytes", 0) / 2**30),
          " ".join("%s %.1f" % (k, w.get(k, 0)) for k in ("attention", "products", "swiglu", "rope", "norms", "lm_head", "step")))
PY
}
train1b none_32k 32768 none
train1b attention_32k 32768 attention
train1b none_32k_again 32768 none
train1b none_64k 65536 none
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
