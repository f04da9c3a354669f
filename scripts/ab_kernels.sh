#!/usr/bin/env bash
# A/B of our own attention kernels between source trees in one GPU call: each tree's flash
# tests, then each tree's benchmark taken in turn (ROUNDS times), then the PyTorch flash peer,
# all in the same run on the same GPU. How a kernel change is judged before it is merged.
#   on this machine:  bash scripts/ab_kernels.sh prepare REF...
#       exports each git ref's tree into .carry/ab/<ref, "/" as "-"> (carried to the GPU machine
#       with .carry; the checkout itself is the baseline)
#   on the GPU machine:  bash scripts/ab_kernels.sh run
#       builds the checkout and every .carry/ab tree (bench_gpu_attention, test_gpu_attention),
#       runs their flash tests, benchmarks those that pass, prints each tree's time as a
#       ratio of the peer's; build logs and results go to $OUT. Exit 1 when a tree fails its tests.
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
out="${OUT:-gpu_out}"  # four files come back: ab.jsonl, torch.jsonl, tests.txt, builds.txt
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out/tests.txt" "$out/builds.txt"
work="$(mktemp -d)"  # each tree's build output and logs
root="$PWD"
trees=(.)
for dir in .carry/ab/*/; do [ -d "$dir" ] && trees+=("${dir%/}"); done
[ ${#trees[@]} -gt 1 ] || { echo "no trees in .carry/ab (run prepare here first)"; exit 2; }
name() { [ "$1" = . ] && echo checkout || basename "$1"; }

t0=$(date +%s)
jobs=$(( $(nproc) / ${#trees[@]} ))
[ "$jobs" -ge 2 ] || jobs=2
pids=()
for tree in "${trees[@]}"; do  # every build at once, the cores shared out
  if [ "$tree" != . ]; then  # each tree gets the carried dependencies, and its own library links
    mkdir -p "$tree/.carry"
    for dep in deps cudnn_frontend; do [ -e "$root/.carry/$dep" ] && ln -sfn "$root/.carry/$dep" "$tree/.carry/$dep"; done
  fi
  (cd "$tree" && OUT="$work/build_$(name "$tree")" BUILD_JOBS=$jobs \
     BUILD_TARGETS="bench_gpu_attention test_gpu_attention" bash scripts/gpu_check.sh build \
     > "$work/build_$(name "$tree").txt" 2>&1) &
  pids+=($!)
done
built=()
for i in "${!trees[@]}"; do
  if wait "${pids[$i]}"; then
    built+=("${trees[$i]}")
  else
    { echo "== build of $(name "${trees[$i]}") failed; it is left out:"
      tail -n 40 "$work/build_$(name "${trees[$i]}").txt"; } | tee -a "$out/builds.txt"
  fi
done
echo "built in $(( $(date +%s) - t0 )) s"

status=0
passed=()
for tree in "${built[@]}"; do
  log="$work/tests_$(name "$tree").txt"
  "$tree/build-gpu/tests/test_gpu_attention" --gtest_filter='*Flash*' > "$log" 2>&1
  rc=$?
  { echo "== $(name "$tree") (rc $rc)"; grep -E '^\[  (PASSED|FAILED) +\]|Failure' "$log"; } >> "$out/tests.txt"
  echo "$(name "$tree") flash tests: rc $rc ($(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' '))"
  if [ $rc -eq 0 ]; then passed+=("$tree"); else status=1; fi
done
[ ${#passed[@]} -gt 0 ] || { echo "no tree passed its tests"; exit 1; }

read -r -a seqs <<< "${SEQS:-8192 32768}"
rm -f "$out/ab.jsonl" "$out/torch.jsonl"
for round in $(seq "${ROUNDS:-2}"); do  # only trees whose tests passed are timed
  for tree in "${passed[@]}"; do
    "$tree/build-gpu/bench_gpu_attention" --backends flash --seqs "${seqs[@]}" --json 2>&1 |
      grep '^{' | sed "s/^{/{\"tree\":\"$(name "$tree")\",\"round\":$round,/" >> "$out/ab.jsonl"
  done
done
python3 bench/torch_sdpa_peer.py --backends flash --seqs "$(IFS=,; echo "${seqs[*]}")" 2>&1 | grep '^{' > "$out/torch.jsonl"
python3 - "$out/ab.jsonl" "$out/torch.jsonl" <<'EOF'
import json, sys
from collections import defaultdict
def timed(r):  # a measured line: no error, both times present and positive
    return r.get("ok", True) and "error" not in r and all(r.get(k, 0) > 0 for k in ("fwd_ms", "fwdbwd_ms"))
ours, failed = defaultdict(list), set()
for r in map(json.loads, open(sys.argv[1])):
    (ours[(r["tree"], r["seq"], r["causal"])].append(r) if timed(r) else failed.add((r["tree"], r["seq"], r["causal"])))
peer = {(r["seq"], r["causal"]): r for r in map(json.loads, open(sys.argv[2]))
        if r.get("backend") == "torch_flash" and timed(r)}
print("| tree | mask | S | fwd ms | fwd+bwd ms | peer fwd ms | peer fwd+bwd ms | fwd vs peer | fwd+bwd vs peer |")
print("|---|---|---|---|---|---|---|---|---|")
for (tree, seq, causal), runs in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "checkout", kv[0][0])):
    f = sum(r["fwd_ms"] for r in runs) / len(runs)
    fb = sum(r["fwdbwd_ms"] for r in runs) / len(runs)
    p = peer.get((seq, causal))
    cell = lambda key, ms: f"{p[key] / ms:.3f}x" if p else "-"
    peer_ms = lambda key: f"{p[key]:.3f}" if p else "-"
    print(f"| {tree} | {'causal' if causal else 'full'} | {seq} | {f:.3f} | {fb:.3f} | {peer_ms('fwd_ms')} | "
          f"{peer_ms('fwdbwd_ms')} | {cell('fwd_ms', f)} | {cell('fwdbwd_ms', fb)} |")
for tree, seq, causal in sorted(failed):
    print(f"{tree} {seq} {'causal' if causal else 'full'}: a run failed (see ab.jsonl)")
EOF
echo "done in $(( $(date +%s) - t0 )) s"
exit $status
