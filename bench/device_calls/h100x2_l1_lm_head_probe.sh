#!/usr/bin/env bash
# One call on 2 GPUs (session l, 2026-11-28): the LM head's loss and gradient in one pass (issue 36)
# and the probe's first GPU run (issue 35).
#  1. build; then side by side: GPU 0 our fused head (fp32 and bf16 logits, chunks 1024-4096)
#     against Liger-Kernel and PyTorch on the same bits, two interleaved rounds; GPU 1 the head's
#     GPU test (ModelCuda.*) and GpuTrain.* (the trainer through the new head)
#  2. both GPUs: seqpar probe --quick, then the probe proper, and seqpar plan on the file it wrote;
#     then every algorithm and auto at 64K and 256K tokens, causal GQA 32:8, in the time left
set -u
PACK_GLOBS="*.jsonl *.err *.log *.json"
CALL_BUDGET_S=570
source bench/device_calls/call_start.sh 32 "bench_gpu_lm_head test_model_cuda test_gpu_train seqpar_cli bench_gpu_ring"
site=/tmp/liger_site; wheels=$(ls .carry/whl/liger_kernel-*.whl)
python3 -c "import packaging" 2>/dev/null || wheels="$wheels $(ls .carry/whl/packaging-*.whl)"
python3 -m pip install -q --no-deps --no-index --target "$site" $wheels > "$out/pip.log" 2>&1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
head_ab() {  # GPU 0: ours, peer, ours, peer on the same bits (round 1 dumps them and checks every side)
  local data=/tmp/lm_head_data; rm -rf "$data"
  for round in 1 2; do
    extra=(); [ $round = 1 ] && extra=(--dump "$data")
    CUDA_VISIBLE_DEVICES=0 timeout 90 ./build-gpu/bench_gpu_lm_head --tokens 32768 --hidden 4096 --vocab 128256 \
      --chunks 1024,2048,4096 --logits f32,bf16 "${extra[@]}" >> "$out/head_ours.jsonl" 2>> "$out/head_ours.err"
    echo "ours round $round rc $?" >> "$out/head_ours.err"
    peer=(--data "$data"); [ $round = 1 ] && peer+=(--check)
    (cd bench && CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -u liger_flce_peer.py "${peer[@]}") >> "$out/head_peer.jsonl" 2>> "$out/head_peer.err"
    echo "peer round $round rc $?" >> "$out/head_peer.err"
  done
}
head_ab &
( CUDA_VISIBLE_DEVICES=1 timeout 60 ./build-gpu/tests/test_model_cuda > "$out/model_cuda.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8 timeout 220 ./build-gpu/tests/test_gpu_train --gtest_filter='GpuTrain.*' > "$out/gpu_train.log" 2>&1 ) &
wait
for f in model_cuda gpu_train; do
  say "$f: $(grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED|Failure' "$out/$f.log" | head -8 | tr '\n' ' ')"
done
say "head: $(grep -h 'rc ' "$out/head_ours.err" "$out/head_peer.err" | tr '\n' ' ')"
python3 - "$out/head_ours.jsonl" "$out/head_peer.jsonl" <<'PY' | tee -a "$out/summary.txt"
import json, os, sys
rows = [json.loads(l) for f in sys.argv[1:] if os.path.exists(f) for l in open(f) if l.startswith("{")]
for r in rows:
    if "ms_fwd_bwd" in r:
        print(f"{r['kind']:22s} {str(r.get('chunk', '')):>5s} {r.get('logits', ''):4s} {r['ms_fwd_bwd']:8.2f} ms {r['ms_fwd']:7.2f} fwd "
              f"{r['tflops_fwd_bwd']:6.1f} TF/s extra {r['peak_extra_bytes'] / 2**30:.3f} GiB grads {r['grad_bytes'] / 2**30:.3f} loss {r['loss']:.6f}")
    else:
        print(json.dumps(r)[:400])
PY
timeout 60 ./build-gpu/seqpar probe --device cuda --gpus 2 --quick --out "$out/probe_quick.json" > "$out/probe_quick.log" 2>&1
say "probe --quick rc $? $(tail -n 2 "$out/probe_quick.log" | tr '\n' ' ')"
l=$(left); timeout $(( l - 150 > 150 ? 150 : (l - 150 > 20 ? l - 150 : 20) )) ./build-gpu/seqpar probe --device cuda --gpus 2 \
  --out "$out/probe_2gpu.json" > "$out/probe.log" 2>&1
say "probe rc $? $(tail -n 2 "$out/probe.log" | tr '\n' ' ')"
[ -s "$out/probe_2gpu.json" ] && { cp "$out/probe_2gpu.json" "$out/probe_2gpu.txt"
  timeout 30 ./build-gpu/seqpar plan --cluster "$out/probe_2gpu.json" --heads 32 --kv-heads 8 --seq 262144 > "$out/plan_2gpu.txt" 2>&1
  say "plan rc $?"; }
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
l=$(left); [ $l -gt 40 ] && { timeout $(( l - 15 )) ./build-gpu/bench_gpu_ring --seqs 65536,262144 --mask causal --layout zigzag \
  --algos auto,ulysses-overlap,ulysses,ring-return,burst-return,ring,distflash --rounds 1 $common >> "$out/causal_2gpu.jsonl" 2>> "$out/ring.err"
  say "2-GPU causal rc $? $(grep -c seqpar_ring "$out/causal_2gpu.jsonl") lines"; }
say end
pack
