#!/usr/bin/env bash
# One call on 2 GPUs (session n, 2026-11-28), issue 35:
#  1. build; GPU 0 test_backends, GPU 1 test_gpu_schedules (the executor's own query pack now holds
#     only D's rows when the backend takes D: its first GPU run)
#  2. seqpar probe on both GPUs, now timing window 4K and 16-document calls beside causal and full
#  3. bench_gpu_ring: GQA 32:8 16 documents at 256K, ring-family and Ulysses (the peaks after the
#     own-pack fix, against call m2's same runs); then every algorithm and auto where the 2-GPU
#     table has no rows: causal GQA 16K, causal MHA 256K, causal GQA 512K
set -u
CALL_BUDGET_S=560
source bench/device_calls/call_start.sh 32 "seqpar_cli bench_gpu_ring test_backends test_gpu_schedules"
( CUDA_VISIBLE_DEVICES=0 timeout 100 ./build-gpu/tests/test_backends > "$out/backends.log" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8 timeout 130 ./build-gpu/tests/test_gpu_schedules > "$out/gpu_schedules.log" 2>&1 ) &
wait
for f in backends gpu_schedules; do
  say "$f: $(grep -E '^\[  (PASSED|FAILED)|Failure|tests ran' "$out/$f.log" | head -8 | tr '\n' ' ')"
done
timeout 170 ./build-gpu/seqpar probe --device cuda --gpus 2 --out "$out/probe_2gpu.json" > "$out/probe.log" 2>&1
say "probe rc $? $(grep -m2 'workspace' "$out/probe.log" | tr '\n' ' ') $(tail -n 1 "$out/probe.log")"
grep -E "window|docs" "$out/probe.log" | grep TFLOP >> "$out/summary.txt"
[ -s "$out/probe_2gpu.json" ] && cp "$out/probe_2gpu.json" "$out/probe_2gpu.txt"
matrix() {  # kv_heads mask layout seqs tag algos
  local l=$(left); [ $l -lt 40 ] && { say "out of time before $5"; return 9; }
  timeout $(( l - 20 < ${CAP:-150} ? l - 20 : ${CAP:-150} )) ./build-gpu/bench_gpu_ring --seqs $4 --mask $2 --layout $3 --algos $6 \
    --heads 32 --kv-heads $1 --head-dim 128 --single-max 0 --rounds 1 >> "$out/matrix_$5.jsonl" 2>> "$out/matrix_$5.err"
  say "$5 rc $? $(grep -c seqpar_ring "$out/matrix_$5.jsonl") lines"
}
all=auto,ulysses-overlap,ulysses,ring-return,burst-return,ring,burst,distflash
CAP=60 matrix 8 docs:16 documents 262144 gqa_docs16_fix ring,ring-return,burst,ulysses
CAP=60 matrix 8 causal zigzag 16384 gqa_causal_16k $all
CAP=90 matrix 32 causal zigzag 262144 mha_causal_256k $all
CAP=200 matrix 8 causal zigzag 524288 gqa_causal_512k $all
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "matrix_*.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.startswith('{"kind":"seqpar_ring"')]
    for r in rows:
        if "fwdbwd_ms" in r:
            print(f"{os.path.basename(f)[7:-6]:16s} S={r['seq']:7d} {r['algo']:16s} ran {r.get('ran', r['algo']):16s} "
                  f"{r['fwdbwd_ms']:9.2f} ms peak_extra {r.get('peak_extra_GiB', 0):.3f} GiB")
    for S in sorted({r["seq"] for r in rows}):
        at = {r["algo"]: r for r in rows if r["seq"] == S and "fwdbwd_ms" in r}
        if "auto" not in at or len(at) < 2: continue
        best = min((r["fwdbwd_ms"], a) for a, r in at.items() if a != "auto")
        print(f"{os.path.basename(f)[7:-6]:16s} S={S:7d} auto ran {at['auto']['ran']:16s} {at['auto']['fwdbwd_ms']:9.2f} ms;"
              f" fastest {best[1]:16s} {best[0]:9.2f} ms; auto/fastest {at['auto']['fwdbwd_ms'] / best[0]:.3f}")
PY
say end
pack
