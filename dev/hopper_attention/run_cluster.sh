#!/usr/bin/env bash
# run_cluster.sh: the one-call GPU script of the 2-CTA cluster forward with K/V multicast
# (cluster_lab.cuh; README section "Persistent forward in 2-CTA clusters: K/V by TMA multicast"),
# from the repository root on an H200 with torch; carry ["dev/hopper_attention/build/cluster"]
# (the lab's forward build from here, copied there; rebuilt if it does not run). Steps: the checks
# (CPU fp64 oracle, bf16 rule, dense cases on the full grid and on one cluster) of cluster_m192
# (D = 64) and cluster192 (D = 128); only if both pass: ab_compare.py against the current kernels
# and cuDNN at the training shape (D = 64 causal 32:8, 32K-128K) and D = 128 dense full 16K/32K;
# the SM clock and board power (nvidia-smi, 20 ms; clocks.py) over back-to-back standalone
# launches, ABBA order; Nsight Compute with free clocks (time, SM clock, L2 and DRAM bytes) at one
# cell per head dim (and the grid: how many clusters fit).
# Call 1: the defaults. Call 2: CHECKS="cluster_m192s3:64 cluster_m192s4:64"
# AB64=persist_m192u,cluster_m192,cluster_m192s3,cluster_m192s4 AB128= CLOCKS=0
# NCUCELLS="persist_m192u,cluster_m192,cluster_m192s4 at D = 64 causal 32:8 32K".
# Call 3: CHECKS="cluster_m192:64 cluster_m192s4:64 cluster192:128" AB64=persist_m192u,cluster_m192,
# cluster_m192s4 SEQS64=32768,65536 CLOCKS=1 BUDGET=100 (the kernel is the library's
# hopper_fwd_cluster.cuh since call 4; that call's commands: results/cluster_run4_h200.log).
set -u
out=${OUT:-out_cluster}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-200}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
say "rev $(git rev-parse --short HEAD 2>/dev/null)"
here=dev/hopper_attention; bd=$here/build/cluster; fwd=$bd/hopper_fwd_test; lib=$bd/libhopper_fwd.so
if ! "$fwd" 2>&1 | grep -q usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: building"
  bash $here/build.sh fwd >> "$out/lab_build.log" 2>&1 || say "LAB BUILD FAILED"
  fwd=$here/build/hopper_fwd_test; lib=$here/build/libhopper_fwd.so
fi
CHECKS=${CHECKS:-"cluster_m192:64 cluster192:128"}  # variant:D, dense cases
AB64=${AB64-persist_m192u,cluster_m192}
AB128=${AB128-persist192u,pp192,cluster192}
NCUCELLS=${NCUCELLS:-"persist_m192u:32768:1:32:8:64 cluster_m192:32768:1:32:8:64 persist192u:16384:0:32:32:128 cluster192:16384:0:32:32:128"}
{
  pids=()
  for c in $CHECKS; do
    v=${c%%:*}; d=${c##*:}
    (timeout 60 $fwd check $v $d dense > "$out/c_$v.tmp" 2>&1 || echo "CHECK-FAILED $v rc=$?" >> "$out/c_$v.tmp") &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  for c in $CHECKS; do cat "$out/c_${c%%:*}.tmp"; rm -f "$out/c_${c%%:*}.tmp"; done
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log"; then say "checks failed: no timing"; say "end"; exit 1; fi
ab() {  # ab TIMEOUT args...: ab_compare.py appended to $out/ab.log, its AB lines to the summary
  local t=$1; shift
  local l=$(left); if [ $l -lt 20 ]; then say "skipped A/B $* (no time)"; return; fi
  [ $t -gt $l ] && t=$l
  local before=$(cat "$out/ab.log" 2>/dev/null | wc -l)
  timeout $t python3 $here/ab_compare.py --lib $lib "$@" >> "$out/ab.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab.log"
  say "A/B $*:"
  tail -n +$((before + 1)) "$out/ab.log" | grep -E "^AB |CHECKBIG|A/B rc|Error" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
}
[ -n "$AB64" ] && ab 70 --seqs ${SEQS64:-32768,65536,131072} --causal 1 --variants $AB64 --kv-heads 8 --dim 64 --rounds 5 --reps 3 --check-rows 128
[ -n "$AB128" ] && ab 50 --seqs 16384,32768 --causal 0 --variants $AB128 --kv-heads 32 --dim 128 --rounds 5 --reps 3 --check-rows 128
if [ "${CLOCKS:-1}" = 1 ] && [ $(left) -gt 50 ]; then
  nvidia-smi -i "${CUDA_VISIBLE_DEVICES%%,*}" --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 20 > "$out/clocks.csv" 2>&1 &
  smi=$!
  sleep 1
  {  # ABBA at each cell: D = 64 causal 32:8 64K (60 launches), D = 128 full 32:32 32K (60 launches)
    for v in persist_m192u cluster_m192 cluster_m192 persist_m192u; do
      echo "WINDOW $v start $(date '+%Y/%m/%d %H:%M:%S.%N')"
      timeout 20 $fwd bench $v 65536 1 32 8 64 60 || echo "BENCH-FAILED $v"
      echo "WINDOW $v end $(date '+%Y/%m/%d %H:%M:%S.%N')"
      sleep 1
    done
    for v in persist192u cluster192 cluster192 persist192u; do
      echo "WINDOW $v start $(date '+%Y/%m/%d %H:%M:%S.%N')"
      timeout 20 $fwd bench $v 32768 0 32 32 128 60 || echo "BENCH-FAILED $v"
      echo "WINDOW $v end $(date '+%Y/%m/%d %H:%M:%S.%N')"
      sleep 1
    done
  } > "$out/bench.log" 2>&1
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  say "clocks (D = 64 causal 32:8 64K, then D = 128 full 32:32 32K):"
  python3 $here/clocks.py "$out/bench.log" "$out/clocks.csv" >> "$out/summary.txt" 2>&1
fi
if command -v ncu >/dev/null; then
  for cell in $NCUCELLS; do
    cell=${cell//:/ }
    [ $(left) -lt 30 ] && { say "ncu skipped: $cell (no time)"; continue; }
    set -- $cell
    timeout 30 ncu --clock-control none -k regex:fwd_ --launch-skip 3 -c 1 --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,launch__grid_size \
      $fwd bench $cell 1 2>&1 | grep -E "duration|per_second|pct|sum|grid_size" | sed "s/^/NCU S=$2 causal=$3 D=$6 $1 /"
  done > "$out/ncu.log" 2>&1
  say "ncu:"; awk '{print $2, $3, $4, $5, $(NF-2), $(NF-1), $(NF)}' "$out/ncu.log" >> "$out/summary.txt"
fi
say "end"
