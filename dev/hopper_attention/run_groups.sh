#!/usr/bin/env bash
# run_groups.sh: the one-call GPU script of the head-group backward (bwd_groups_lab.cuh: the
# backward as G head groups alternating over two streams, so one group's bandwidth-bound fixed
# part runs beside another's main kernel; session v), from the repository root on an H200 with
# torch; carry ["dev/hopper_attention/build/v2"] (built here with build.sh bwd and mask, copied
# there, the .so stripped). Steps, each capped:
#   1. checks: LAB_GROUPS=2 hopper_bwd_test check 128 short64g,baseg,q80g all (the 12 dense and 10
#      masked D = 128 cases against the fp64 oracle; H = 4 with H_kv 2 or 4 splits into two groups,
#      MQA falls back to one);
#   2. only if every check passes: standalone, the whole backward after our forward, in A/B/B/A
#      order: 256 documents at 32K (short64 / short64g at G = 4 and 8, and G = 4 with the second
#      stream at high priority), 256 documents at 128K (base / baseg), dense causal 32K (q80 / q80g);
#   3. ab_masks.py: fwd+bwd against compiled flex, interleaved, at 32K (docs256, docs128, bigbird64:
#      short64 / short64g) and 128K (docs256: base / baseg).
set -u
out=${OUT:-out_groups}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-240}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
here=dev/hopper_attention; bd=$here/build/v2; bwd=$bd/hopper_bwd_test; lib=$bd/libhopper_mask.so
chmod +x $bwd 2>/dev/null
if ! "$bwd" 2>&1 | grep -qi usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: stop"; say "end"; exit 1
fi
LAB_GROUPS=2 timeout 60 $bwd check 128 short64g,baseg,q80g all > "$out/checks.log" 2>&1 || echo "CHECK-FAILED rc=$?" >> "$out/checks.log"
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log" || ! grep -q 'cases pass' "$out/checks.log"; then
  grep -E '^FAIL|CHECK-FAILED|error' "$out/checks.log" | head -n 12 >> "$out/summary.txt"
  say "checks failed: no timing"; say "end"; exit 1
fi
bm() {  # bm TAG ENV... -- ARGS: one benchmask / bench line into bench.log
  local tag=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $tag ${envs[*]} $*" >> "$out/bench.log"
  env "${envs[@]}" timeout 40 $bwd "$@" 2>&1 | grep -E "^BENCH|rror" | grep -v "main kernel only" \
    | sed -E 's/ \(min [0-9.]* max [0-9.]*\)//; s/ visible=.*boundary=[0-9]*//' >> "$out/bench.log"
}
for G in 4 8; do
  for v in 6 7 7 6; do bm "docs256 32K G=$G" LAB_GROUPS=$G -- benchmask 32768 docs:256 32 32 128 20 $v; done
done
for v in 6 7 7 6; do bm "docs256 32K G=4 prio" LAB_GROUPS=4 LAB_GROUP_PRIORITY=1 -- benchmask 32768 docs:256 32 32 128 20 $v; done
say "standalone 32K done"
for v in 0 8 8 0; do bm "docs256 128K G=4" LAB_GROUPS=4 -- benchmask 131072 docs:256 32 32 128 5 $v; done
for v in 5 9 9 5; do bm "causal 32K G=4" LAB_GROUPS=4 -- bench 32768 1 32 32 128 5 $v; done
say "standalone:"; cat "$out/bench.log" >> "$out/summary.txt"
ab() {  # ab <log> <cap> <args...>
  local log=$1 cap=$2; shift 2
  local l=$(left); if [ $l -lt 25 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  LAB_GROUPS=${ABG:-4} timeout $cap python3 $here/ab_masks.py --lib $lib --fwd persist192 --fwd-variants persist64 \
    --causal-ref q80 --fb-all --skip-causal "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($*):"; sed -n '/^SUMMARY per backward/,$p' "$out/$log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error|A/B rc" "$out/$log" | head -n 12 >> "$out/summary.txt"
}
ab ab_32k.log 100 --bwd-variants short64,short64g --seqs 32768 --masks docs256,docs128,bigbird64 --rounds 3 --reps 2
ab ab_128k.log 60 --bwd-variants base,baseg --seqs 131072 --masks docs256 --rounds 2 --reps 1
say "end"
