#!/usr/bin/env bash
# run_fused.sh: the one-call GPU script of the persistent forward's fused tile boundary and Q
# prefetch (README section "Fused tile boundary"), from the repository root on an H100/H200 with
# torch, carry ["dev/hopper_attention/build"] (the lab's build from here; rebuilt if it does not
# run): the checks (CPU fp64 oracle, dense and masked; each persistent variant on its full grid
# and on 3 CTAs) of VARS (D = 128) and VARS64 (D = 64); SM clock and power sampled (nvidia-smi,
# 50 ms) during standalone benches of CLOCKVARS at 32K dense full (40 launches each, the list then
# reversed); ab_compare.py (AB / AB64 and cuDNN SDPA interleaved in one process) at SEQS, full and
# causal, H 32:32 and 32:8. Logs in $OUT (at most 7 files).
set -u
out=${OUT:-out_fused}; t0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
VARS=${VARS:-"persist192 persist192p persist192x persist192xp persist176x"}
VARS64=${VARS64:-"persist_m192 persist_m192p persist_m192x persist_m192xp"}
CLOCKVARS=${CLOCKVARS:-"pp192 persist192 persist192x"}
AB=${AB:-pp192,persist192,persist192p,persist192x,persist192xp,persist176x}
AB64=${AB64:-m192,persist_m192,persist_m192p,persist_m192x,persist_m192xp}
SEQS=${SEQS:-8192,16384,32768}; SEQS64=${SEQS64:-$SEQS}; ROUNDS=${ROUNDS:-8}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
here=dev/hopper_attention; fwd=$here/build/hopper_fwd_test
if ! "$fwd" 2>&1 | grep -q usage || ! python3 -c "import ctypes; ctypes.CDLL('$here/build/libhopper_fwd.so')"; then
  say "carried build does not run here: building"
  bash $here/build.sh fwd > "$out/build.log" 2>&1 || say "LAB BUILD FAILED"
fi
say "lab ready: $(grep -h 'spill stores' $here/build/ptxas.txt | grep -vc ' 0 bytes spill') ptxas lines with spills"
{
  for v in $VARS; do timeout 120 $fwd check $v 128 all || echo "CHECK-FAILED fwd $v"; done
  for v in $VARS64; do timeout 120 $fwd check $v 64 all || echo "CHECK-FAILED fwd $v"; done
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
nvidia-smi -i "${CUDA_VISIBLE_DEVICES%%,*}" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > "$out/clocks.csv" 2>&1 &
smi=$!
sleep 1
{
  for v in $CLOCKVARS $(echo $CLOCKVARS | tr ' ' '\n' | tac); do
    echo "WINDOW $v start $(date '+%Y/%m/%d %H:%M:%S.%N')"
    timeout 30 $fwd bench $v 32768 0 32 32 128 40 || echo "BENCH-FAILED $v"
    echo "WINDOW $v end $(date '+%Y/%m/%d %H:%M:%S.%N')"
    sleep 1
  done
} > "$out/bench.log" 2>&1
kill $smi 2>/dev/null; wait $smi 2>/dev/null
python3 $here/clocks.py "$out/bench.log" "$out/clocks.csv" >> "$out/summary.txt" 2>&1
say "clock benches done"
timeout 200 python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so --seqs $SEQS \
  --variants $AB --kv-heads 32,8 --dim 128 --rounds $ROUNDS --reps 4 > "$out/ab128.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab128.log"
say "A/B D=128:"; grep -E "^AB |CHECKBIG|A/B rc|Error" "$out/ab128.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
timeout 120 python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so --seqs $SEQS64 \
  --variants $AB64 --kv-heads 32,8 --dim 64 --rounds $ROUNDS --reps 4 > "$out/ab64.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab64.log"
say "A/B D=64:"; grep -E "^AB |CHECKBIG|A/B rc|Error" "$out/ab64.log" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
say "end"
