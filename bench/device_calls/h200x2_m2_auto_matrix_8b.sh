#!/usr/bin/env bash
# One call on 2 GPUs (session m, 2026-11-28): the 8B preset's step on two GPUs (issue 36) and
# `auto` against every algorithm where the 2-GPU table had no rows (issue 35): window and
# documents masks (GQA 32:8 and MHA), causal MHA.
#  1. build; the 8B preset at 64K, ZeRO-3, --profile (where its step goes)
#  2. seqpar probe on both GPUs (now with the backend's workspace measured)
#  3. bench_gpu_ring, every algorithm and auto, one process per (heads, mask): window 4K and 16
#     documents at 16K-256K, causal MHA at 16K-64K
#  4. PyTorch's peer with the 8B model at 64K, in the time left (on 4 x H100 it ran out of memory)
set -u
CALL_BUDGET_S=470
source bench/device_calls/call_start.sh 32 "seqpar_cli bench_gpu_ring"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
timeout 140 ./build-gpu/seqpar train --device cuda --gpus 2 --model 8b --zero 3 --data "text:$txt" --seq 65536 \
  --batch 1 --steps 4 --warmup 10 --lr 3e-5 --checkpointing attention --profile --json \
  > "$out/train_8b_64k.jsonl" 2> "$out/train_8b_64k.err"
say "8B 64K rc $? $(tail -n 1 "$out/train_8b_64k.jsonl" | head -c 1200) $(grep -m1 -i 'error' "$out/train_8b_64k.err")"
timeout 90 ./build-gpu/seqpar probe --device cuda --gpus 2 --out "$out/probe_2gpu.json" > "$out/probe.log" 2>&1
say "probe rc $? $(grep -m2 'workspace' "$out/probe.log" | tr '\n' ' ') $(tail -n 1 "$out/probe.log")"
[ -s "$out/probe_2gpu.json" ] && cp "$out/probe_2gpu.json" "$out/probe_2gpu.txt"
algos=auto,ulysses-overlap,ulysses,ring-return,burst-return,ring,burst,distflash
matrix() {  # kv_heads mask layout seqs tag
  local l=$(left); [ $l -lt 40 ] && { say "out of time before $5"; return 9; }
  timeout $(( l - 30 < 120 ? l - 30 : 120 )) ./build-gpu/bench_gpu_ring --seqs $4 --mask $2 --layout $3 --algos $algos \
    --heads 32 --kv-heads $1 --head-dim 128 --single-max 0 --rounds 1 >> "$out/matrix_$5.jsonl" 2>> "$out/matrix_$5.err"
  say "$5 rc $? $(grep -c seqpar_ring "$out/matrix_$5.jsonl") lines"
}
matrix 8 window:4096,0 zigzag 16384,65536,262144 gqa_window4k
matrix 8 docs:16 documents 16384,65536,262144 gqa_docs16
matrix 32 causal zigzag 16384,65536 mha_causal
matrix 32 window:4096,0 zigzag 16384,65536,262144 mha_window4k
matrix 32 docs:16 documents 16384,65536,262144 mha_docs16
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "matrix_*.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.startswith('{"kind":"seqpar_ring"')]
    for S in sorted({r["seq"] for r in rows}):
        at = {r["algo"]: r for r in rows if r["seq"] == S and "fwdbwd_ms" in r}
        if "auto" not in at or len(at) < 2: continue
        best = min((r["fwdbwd_ms"], a) for a, r in at.items() if a != "auto")
        print(f"{os.path.basename(f)[7:-6]:14s} S={S:7d} auto ran {at['auto']['ran']:16s} {at['auto']['fwdbwd_ms']:9.2f} ms;"
              f" fastest {best[1]:16s} {best[0]:9.2f} ms; auto/fastest {at['auto']['fwdbwd_ms'] / best[0]:.3f}")
PY
l=$(left); [ $l -gt 100 ] && { timeout $(( l - 15 )) torchrun --standalone --nproc_per_node=2 bench/torch_train_peer.py \
  --model 8b --seqs 65536 --steps 3 --data $txt > "$out/peer_8b_64k.jsonl" 2> "$out/peer_8b_64k.err"
  say "peer 8B 64K rc $? $(grep '^{' "$out/peer_8b_64k.jsonl" | tail -n 1 | head -c 400) $(grep -m1 -i 'error' "$out/peer_8b_64k.err" | head -c 300)"; }
say end
pack
