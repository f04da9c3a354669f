#!/usr/bin/env bash
# A/B of our own attention kernels between source trees in one GPU call: each tree's flash
# tests, then each tree's benchmark taken in turn (ROUNDS times), then the PyTorch flash peer,
# all in the same run on the same GPU. How a kernel change is judged before it is merged.
#   on this machine:  bash scripts/ab_kernels.sh prepare REF...
#       exports each git ref's tree into .carry/ab/<ref, "/" as "-"> (carried to the GPU machine
#       with .carry; the checkout itself is the baseline)
#   on the GPU machine:  bash scripts/ab_kernels.sh run
#       builds the checkout and every .carry/ab tree (bench_gpu_attention, test_gpu_attention),
#       runs their flash tests, benchmarks, prints each tree's time as a ratio of the peer's.
# Env: SEQS (default "8192 32768"), ROUNDS (default 2), OUT (default ./gpu_out).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 prepare REF..." >&2; exit 2; }
    rm -rf .carry/ab && mkdir -p .carry/ab
    for ref in "$@"; do
      dir=".carry/ab/${ref//\//-}"
      mkdir -p "$dir" && git archive "$ref" | tar -x -C "$dir" || exit 1
      echo "$ref -> $dir"
    done
    exit 0 ;;
  run) ;;
  *) echo "usage: $0 prepare REF... | run" >&2; exit 2 ;;
esac

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-gpu_out}"
mkdir -p "$out"
root="$PWD"
trees=(.)
for dir in .carry/ab/*/; do [ -d "$dir" ] && trees+=("${dir%/}"); done
[ ${#trees[@]} -gt 1 ] || { echo "no trees in .carry/ab (run prepare here first)"; exit 2; }
name() { [ "$1" = . ] && echo checkout || basename "$1"; }

t0=$(date +%s)
pids=()
for tree in "${trees[@]}"; do  # every build at once: each is a handful of CUDA sources
  [ "$tree" = . ] || ln -sfn "$root/.carry" "$tree/.carry"  # the carried dependencies
  (cd "$tree" && OUT="/tmp/ab_build_$(name "$tree")" BUILD_TARGETS="bench_gpu_attention test_gpu_attention" \
     bash scripts/gpu_check.sh build > "/tmp/ab_build_$(name "$tree").txt" 2>&1) &
  pids+=($!)
done
status=0
for i in "${!trees[@]}"; do
  wait "${pids[$i]}" || { echo "build of $(name "${trees[$i]}") failed:"; tail -n 20 "/tmp/ab_build_$(name "${trees[$i]}").txt"; status=1; }
done
[ $status -eq 0 ] || exit 1
echo "built in $(( $(date +%s) - t0 )) s"

for tree in "${trees[@]}"; do
  "$tree/build-gpu/tests/test_gpu_attention" --gtest_filter='*Flash*' > "$out/tests_$(name "$tree").txt" 2>&1
  echo "$(name "$tree") flash tests: rc $? ($(grep -E '^\[  (PASSED|FAILED)  \]' "$out/tests_$(name "$tree").txt" | tr '\n' ' '))"
done

read -r -a seqs <<< "${SEQS:-8192 32768}"
rm -f "$out/ab.jsonl"
for round in $(seq "${ROUNDS:-2}"); do
  for tree in "${trees[@]}"; do
    "$tree/build-gpu/bench_gpu_attention" --backends flash --seqs "${seqs[@]}" --json 2>&1 |
      grep '^{' | sed "s/^{/{\"tree\":\"$(name "$tree")\",\"round\":$round,/" >> "$out/ab.jsonl"
  done
done
python3 bench/torch_sdpa_peer.py --backends flash --seqs "$(IFS=,; echo "${seqs[*]}")" 2>&1 | grep '^{' > "$out/torch.jsonl"
python3 - "$out/ab.jsonl" "$out/torch.jsonl" <<'EOF'
import json, sys
from collections import defaultdict
ours = defaultdict(list)
for r in map(json.loads, open(sys.argv[1])):
    ours[(r["tree"], r["seq"], r["causal"])].append(r)
peer = {(r["seq"], r["causal"]): r for r in map(json.loads, open(sys.argv[2])) if r.get("backend") == "torch_flash"}
print("| tree | mask | S | fwd ms | fwd+bwd ms | peer fwd ms | peer fwd+bwd ms | fwd vs peer | fwd+bwd vs peer |")
print("|---|---|---|---|---|---|---|---|---|")
for (tree, seq, causal), runs in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "checkout", kv[0][0])):
    f = sum(r["fwd_ms"] for r in runs) / len(runs)
    fb = sum(r["fwdbwd_ms"] for r in runs) / len(runs)
    p = peer.get((seq, causal))
    ratio = lambda key, ms: f"{p[key] / ms:.3f}x" if p else "-"
    print(f"| {tree} | {'causal' if causal else 'full'} | {seq} | {f:.3f} | {fb:.3f} | "
          f"{p['fwd_ms'] if p else float('nan'):.3f} | {p['fwdbwd_ms'] if p else float('nan'):.3f} | "
          f"{ratio('fwd_ms', f)} | {ratio('fwdbwd_ms', fb)} |")
EOF
echo "done in $(( $(date +%s) - t0 )) s"
