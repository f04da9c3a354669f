#!/usr/bin/env bash
# One call on one H100 (issue 36, last bullet): our fused LM head + cross-entropy (bench_gpu_lm_head)
# against Liger-Kernel's fused linear cross-entropy and PyTorch's plain head (bench/liger_flce_peer.py)
# at hidden 4096, vocab 128256, 32K tokens, two interleaved rounds (ours, peer, ours, peer) so that
# clock drift hits both. Round 1 dumps our inputs and gradient samples; the peer runs on those bits
# and checks every side against an fp32 oracle. About 3 minutes. Env: CHUNKS (ours, default
# 1024,2048,4096; 1024 is the trainer's), TOKENS, BUDGET_S.
# Before the call, here: rm -rf .carry/snap && mkdir -p .carry/snap && git archive HEAD | tar -x -C .carry/snap
# Liger's wheel (and packaging, which it imports) is carried in .carry/whl (pip download liger-kernel --no-deps).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-lm" && ln -sfn "$root/build-gpu-lm" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-240}
left() { echo $((budget - (SECONDS - t0))); }
cap() { local l=$(left); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }  # a step's timeout: its cap or what is left
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf logs.tgz *.log *.err 2>/dev/null; rm -f *.log *.err); }
nvidia-smi -L | tee -a "$out/summary.txt"
BUILD_JOBS=16 BUILD_TARGETS=bench_gpu_lm_head timeout 150 bash scripts/gpu_check.sh build > "$out/gpu_check.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { grep -B3 -A12 -m3 ' error\|Error ' "$out/gpu_check.log" | head -60; pack; exit 1; }
site=/tmp/liger_site  # the carried wheels; packaging only where the machine lacks it
wheels=$(ls .carry/whl/liger_kernel-*.whl)
python3 -c "import packaging" 2>/dev/null || wheels="$wheels $(ls .carry/whl/packaging-*.whl)"
python3 -m pip install -q --no-deps --no-index --target "$site" $wheels > "$out/pip.log" 2>&1
say "pip rc $? ($wheels)"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
data=/tmp/lm_head_data; rm -rf "$data"
T=${TOKENS:-32768}
for round in 1 2; do
  extra=(); [ $round = 1 ] && extra=(--dump "$data")
  timeout $(cap 60) ./build-gpu/bench_gpu_lm_head --tokens $T --hidden 4096 --vocab 128256 \
    --chunks "${CHUNKS:-1024,2048,4096}" "${extra[@]}" >> "$out/ours.jsonl" 2>> "$out/ours.err"
  say "ours round $round rc $? | $(tail -n 3 "$out/ours.err" | tr '\n' '|')"
  peer=(--tokens $T); [ -f "$data/meta.json" ] && peer=(--data "$data")
  [ $round = 1 ] && [ -f "$data/meta.json" ] && peer+=(--check)
  [ $(left) -lt 30 ] && { say "out of time before the peer, round $round"; break; }
  (cd bench && timeout $(cap 130) python3 -u liger_flce_peer.py "${peer[@]}") >> "$out/peer.jsonl" 2>> "$out/peer.err"
  say "peer round $round rc $? | $(tail -n 2 "$out/peer.err" | tr '\n' '|')"
done
python3 - "$out/ours.jsonl" "$out/peer.jsonl" <<'EOF' | tee -a "$out/summary.txt"
import json, os, sys  # one readable row per measurement, then the checks
rows = [json.loads(l) for f in sys.argv[1:] if os.path.exists(f) for l in open(f) if l.startswith("{")]
print(f"{'kind':24s} {'chunk':>6s} {'fwd+bwd ms':>10s} {'fwd ms':>8s} {'TFLOP/s':>8s} {'extra GiB':>9s} "
      f"{'grads GiB':>9s} loss")
for r in rows:
    if "ms_fwd_bwd" in r:
        print(f"{r['kind']:24s} {str(r.get('chunk', '')):>6s} {r['ms_fwd_bwd']:10.2f} {r['ms_fwd']:8.2f} "
              f"{r['tflops_fwd_bwd']:8.1f} {r['peak_extra_bytes'] / 2**30:9.3f} {r['grad_bytes'] / 2**30:9.3f} {r['loss']:.6f}")
    else:
        print(json.dumps(r))
EOF
say end
pack
