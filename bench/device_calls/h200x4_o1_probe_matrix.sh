#!/usr/bin/env bash
# One call on 4 GPUs (session o, 2026-11-28), issues 35 and 34's 4-GPU rows on H200s (every 4-GPU
# row in docs/ so far is 4 x H100):
#  1. build; `seqpar probe` on the 4 GPUs (causal, full, window 4K, 16 documents; links in pairs),
#     kept in /tmp/o_keep for the next calls on the same machine
#  2. `auto` (on the probed cluster: SEQPAR_CLUSTER) against every algorithm, dense causal (zigzag):
#     GQA 32:8 and MHA at 64K (16K a GPU) and 256K (64K a GPU) with the one-GPU kernel measured on
#     every GPU; GQA at 512K with the five fastest families
#  3. PyTorch context parallel (cuDNN), causal, the same calls: GQA 64K / 256K / 512K, MHA 64K / 256K
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-565}
source bench/device_calls/call_start.sh 64 "seqpar_cli bench_gpu_ring"
mkdir -p /tmp/o_keep
timeout 170 ./build-gpu/seqpar probe --device cuda --gpus 4 --out "$out/probe_4gpu.json" > "$out/probe.log" 2>&1
say "probe rc $? $(tail -n 1 "$out/probe.log")"
grep TFLOP "$out/probe.log" >> "$out/summary.txt"
if [ -s "$out/probe_4gpu.json" ]; then
  cp "$out/probe_4gpu.json" /tmp/o_keep/; cp "$out/probe_4gpu.json" "$out/probe_4gpu.txt"
  export SEQPAR_CLUSTER=/tmp/o_keep/probe_4gpu.json
fi
matrix() {  # kv_heads mask layout seqs tag algos [extra bench flags]
  local l=$(left); [ $l -lt 40 ] && { say "out of time before $5"; return 9; }
  timeout $(( l - 25 < ${CAP:-150} ? l - 25 : ${CAP:-150} )) ./build-gpu/bench_gpu_ring --seqs $4 --mask $2 --layout $3 \
    --algos $6 --heads 32 --kv-heads $1 --head-dim 128 ${7:-} >> "$out/matrix_$5.jsonl" 2>> "$out/matrix_$5.err"
  say "$5 rc $? $(grep -c seqpar_ring "$out/matrix_$5.jsonl") lines"
}
all=auto,ulysses-overlap,ulysses,ulysses-ring,ring-return,burst-return,ring,burst,distflash,attention2d-overlap
top=auto,ulysses-overlap,ulysses,ring-return,burst-return
CAP=50 matrix 8 causal zigzag 65536 gqa_causal_64k $all "--single-max 65536 --rounds 2"
CAP=50 matrix 32 causal zigzag 65536 mha_causal_64k $all "--single-max 65536 --rounds 2"
CAP=110 matrix 8 causal zigzag 262144 gqa_causal_256k $all "--single-max 65536 --rounds 1"
CAP=110 matrix 8 causal zigzag 524288 gqa_causal_512k $top "--single-max 0 --rounds 1"
gpus=$(nvidia-smi -L | wc -l)
peer() {  # tag seqs kv_heads
  local l=$(left); [ $l -lt 50 ] && { say "out of time before peer $1"; return 9; }
  local cap=$(( l - 20 < 130 ? l - 20 : 130 ))
  timeout $cap torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py --seqs $2 --kv-heads $3 \
    --max-seconds $(( cap - 25 )) >> "$out/peer_cp_$1.jsonl" 2>> "$out/peer_cp_$1.err"
  say "peer $1 rc $? $(grep -c fwdbwd_ms "$out/peer_cp_$1.jsonl") lines"
}
peer gqa 65536,262144,524288 8
peer mha 65536 32
CAP=110 matrix 32 causal zigzag 262144 mha_causal_256k $all "--single-max 0 --rounds 1"
peer mha256 262144 32
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
peer = {}
for f in glob.glob(os.path.join(out, "peer_cp_*.jsonl")):
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            if "fwdbwd_ms" in r: peer[(r.get("kv_heads"), r.get("seq"))] = r["fwdbwd_ms"]
for f in sorted(glob.glob(os.path.join(out, "matrix_*.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.startswith('{"kind":"seqpar_ring"')]
    for r in rows:
        if "fwdbwd_ms" in r:
            print(f"{os.path.basename(f)[7:-6]:16s} S={r['seq']:7d} {r['algo']:19s} ran {r.get('ran', r['algo']):19s} "
                  f"{r['fwdbwd_ms']:9.2f} ms groups {r.get('head_groups')} of-1gpu {r.get('fraction_of_single_gpu', 0):.3f} "
                  f"peak_extra {r.get('peak_extra_GiB', 0):.3f} GiB")
    for S in sorted({r["seq"] for r in rows}):
        at = {r["algo"]: r for r in rows if r["seq"] == S and "fwdbwd_ms" in r}
        if "auto" not in at or len(at) < 2: continue
        best = min((r["fwdbwd_ms"], a) for a, r in at.items() if a != "auto")
        a = at["auto"]; p = peer.get((a["kv_heads"], S))
        print(f"{os.path.basename(f)[7:-6]:16s} S={S:7d} auto ran {a['ran']:16s} {a['fwdbwd_ms']:9.2f} ms;"
              f" fastest {best[1]:16s} {best[0]:9.2f} ms; auto/fastest {a['fwdbwd_ms'] / best[0]:.3f}"
              + (f"; PyTorch CP {p:.2f} ms, PyTorch/auto {p / a['fwdbwd_ms']:.3f}" if p else ""))
PY
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
