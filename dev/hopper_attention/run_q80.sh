#!/usr/bin/env bash
# run_q80.sh: the one-call GPU script of the D = 128 backward with 80-row query tiles (README
# section "Backward at D = 128: 80-row query tiles"; bwd_q80.cuh, lab variant 5 "q80" (10 until the lab's session-q options left)): the lab's
# binaries (carried from here in dev/hopper_attention/build, rebuilt if they do not run); the
# checks (CPU fp64 oracle, bf16 rule: D = 128 base and q80 on the same inputs, every dense case;
# D = 64 q128 dense, the library's D = 64 kernel); ab_bwd.py (base, q80 and cuDNN SDPA interleaved;
# uniform [-1, 1) q, k, v, dO; H = 32, H_kv 32 and 8; full and causal; 8K-32K); the whole backward
# standalone (base q80 q80 base); Nsight Compute of the main kernels at 16K full. BACKEND=1 also
# builds the library's test_backends and runs the backend's ctest cases (carry .carry then).
# From the repository root on an H100/H200; logs in $OUT.
set -u
out=${OUT:-out_q80}; t0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
elapsed() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
say "rev $(git rev-parse --short HEAD 2>/dev/null) + working tree"
here=dev/hopper_attention
lib_pid=""
if [ "${BACKEND:-0}" = 1 ]; then
  (
    source scripts/gpu_env.sh
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
      -DCMAKE_LIBRARY_PATH="$lib_path" -DCMAKE_INCLUDE_PATH="$inc_path" 2>&1 | grep -E "seqpar|Error|error"
    nice cmake --build build-gpu -j 12 --target test_backends 2>&1 | grep -E "warning|error|Linking" | tail -n 30
  ) > "$out/lib_build.log" 2>&1 &
  lib_pid=$!
fi
fwd=$here/build/hopper_fwd_test; bwd=$here/build/hopper_bwd_test
$bwd > /dev/null 2>&1; rc=$?
if [ $rc -ge 126 ] || [ ! -f $here/build/libhopper_fwd.so ]; then
  say "carried binaries do not run (rc $rc): building"
  bash $here/build.sh > "$out/lab_build.log" 2>&1 || say "LAB BUILD FAILED"
fi
say "lab ready: $(grep -h 'spill stores' $here/build/ptxas*.txt | grep -vc ' 0 bytes spill') ptxas lines with spills"
grep -A2 "Compiling entry function '_ZN6seqpar6hopper7bwd_q80" $here/build/ptxas_bwd.txt | grep -E "spill|Used" >> "$out/summary.txt"
{
  timeout 100 $bwd check 128 base,q80 dense || echo "CHECK-FAILED bwd 128 rc=$?"
  timeout 40 $bwd check 64 q128 dense || echo "CHECK-FAILED bwd 64 rc=$?"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
if ! grep -q "CHECK-FAILED bwd 128" "$out/checks.log"; then
  timeout 150 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so --bwd-lib $here/build/libhopper_bwd.so \
    --seqs "${AB_SEQS:-8192,16384,32768}" --kv-heads 32,8 --dim 128 --variants base,q80 --rounds ${ROUNDS:-5} \
    > "$out/ab_bwd.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab_bwd.log"
  say "A/B:"; grep -E "^SUMMARY|SUSPECT|Error|rc=|CHECKREF|CHECKALL" "$out/ab_bwd.log" >> "$out/summary.txt"
  # The whole backward and the main kernel alone, standalone (5 calls, median), order 0 5 5 0.
  for c in ${BENCH_CASES:-16384:0 32768:0}; do
    IFS=: read S causal <<< "$c"
    for v in 0 5 5 0; do timeout 30 $bwd bench $S $causal 32 32 128 5 $v 2>&1 | grep -E "^BENCH bwd" ; done
  done > "$out/bench.log" 2>&1
  sed 's/ (min [0-9.]* max [0-9.]*)//' "$out/bench.log" >> "$out/summary.txt"
  if command -v ncu >/dev/null; then
    for v in 0 5; do
      [ $(elapsed) -gt ${NCU_UNTIL:-230} ] && { say "ncu skipped from v$v (time)"; break; }
      timeout 45 ncu -k regex:"bwd_kernel|bwd_q80_kernel" -c 1 --section SpeedOfLight --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes.sum \
        $bwd bench 16384 0 32 32 128 1 $v 2>&1 | grep -vE "^==PROF==|^\s*$" | sed "s/^/NCU S=16384 full v$v /" >> "$out/ncu.log"
    done
    grep -E "Duration|tensor_op|lts__t_bytes|dram__bytes|Warp Cycles Per Issued|L1/TEX Cache Throughput" "$out/ncu.log" >> "$out/summary.txt"
  fi
fi
if [ -n "$lib_pid" ]; then
  waited=0; while kill -0 $lib_pid 2>/dev/null && [ $waited -lt 150 ]; do sleep 2; waited=$((waited + 2)); done
  if ! kill -0 $lib_pid 2>/dev/null; then
    (cd build-gpu && timeout 100 ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
    say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
    grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
  else say "library not built in time"; kill $lib_pid 2>/dev/null; fi
fi
say "end"
