#!/usr/bin/env bash
# run_order.sh: the one-call GPU script of the D = 64 forward's unit-order / tile-shape round (README
# section "D = 64 forward: unit order and tile shape"), from the repository root on an H200 with
# torch; carry [".carry/deps", ".carry/cudnn_frontend", ".carry/whl", ".carry/oldpath",
# "dev/hopper_attention/build/order"] (the lab's forward build from here, copied into build/order;
# rebuilt if it does not run). Steps: the library's test_backends built in the background; the
# checks (CPU fp64 oracle, bf16 rule; persistent variants on their full grid and on 3 CTAs) of
# VARS; Nsight Compute (free clocks) of NCUVARS at causal 32:8, 32K-128K (L2 and DRAM bytes);
# ab_compare.py of AB against cuDNN at the training shape (causal 32:8, 32K-128K) and the issue's
# cells (32:32 and 32:8, full and causal, 8K-32K); the backend's ctest cases in the time left.
# Run 1: the defaults. Run 2: VARS="persist_m192u persist_m192c" AB=persist_m192u,persist_m192g,persist_m192c
# LONG=0 NCU=0 SHORT_AGAIN=1.
set -u
out=${OUT:-out_order}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-300}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
VARS=${VARS:-"persist_m192u persist_m192g persist_n192u persist_n192g"}
NCUVARS=${NCUVARS:-"persist_m192u persist_m192g"}
AB=${AB:-persist_m192u,persist_m192g,persist_n192u,persist_n192g}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
say "rev $(git rev-parse --short HEAD 2>/dev/null); backend diff: $(git diff --stat -- src/kernels/hopper/hopper_kernels.cu 2>/dev/null | tail -n 1)"
lib_pid=""
if [ "${BACKEND:-1}" = 1 ]; then
  (
    source scripts/gpu_env.sh
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
      -DCMAKE_LIBRARY_PATH="$lib_path" -DCMAKE_INCLUDE_PATH="$inc_path" 2>&1 | grep -E "seqpar|Error|error"
    nice cmake --build build-gpu -j 12 --target test_backends 2>&1 | grep -E "warning|error|Linking|spill" | tail -n 30
  ) > "$out/lib_build.log" 2>&1 &
  lib_pid=$!
fi
here=dev/hopper_attention; bd=$here/build/order; fwd=$bd/hopper_fwd_test; lib=$bd/libhopper_fwd.so
if ! "$fwd" 2>&1 | grep -q usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: building"
  bash $here/build.sh fwd >> "$out/lab_build.log" 2>&1 || say "LAB BUILD FAILED"
  fwd=$here/build/hopper_fwd_test; lib=$here/build/libhopper_fwd.so
fi
{
  pids=()
  for v in $VARS; do
    w=dense; case $v in persist_m192g|persist_m192c) w=all;; esac
    (timeout 120 $fwd check $v 64 $w > "$out/check_$v.tmp" 2>&1 || echo "CHECK-FAILED fwd $v" >> "$out/check_$v.tmp") &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  for v in $VARS; do cat "$out/check_$v.tmp"; rm -f "$out/check_$v.tmp"; done
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
ab() {  # ab TIMEOUT args...: ab_compare.py appended to $out/ab.log, its AB lines to the summary
  local t=$1; shift
  local l=$(left); if [ $l -lt 20 ]; then say "skipped A/B $* (no time)"; return; fi
  [ $t -gt $l ] && t=$l
  local before=$(cat "$out/ab.log" 2>/dev/null | wc -l)
  timeout $t python3 $here/ab_compare.py --lib $lib "$@" >> "$out/ab.log" 2>&1 || echo "A/B rc=$?" >> "$out/ab.log"
  say "A/B $*:"
  tail -n +$((before + 1)) "$out/ab.log" | grep -E "^AB |CHECKBIG|A/B rc|Error" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
}
# LONG=0: no training-shape A/B; SHORT_AGAIN=1: the causal 8K-16K cells once more (a second process).
[ "${LONG:-1}" = 1 ] && ab 80 --seqs 32768,65536,131072 --causal 1 --variants $AB --kv-heads 8 --dim 64 --rounds 5 --reps 3 --check-rows 128
ab 100 --seqs 8192,16384,32768 --variants $AB --kv-heads 32,8 --dim 64 --rounds 8 --reps 4
[ "${SHORT_AGAIN:-0}" = 1 ] && ab 40 --seqs 8192,16384 --causal 1 --variants $AB --kv-heads 32,8 --dim 64 --rounds 12 --reps 4 --check-rows 0
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null && [ $(left) -gt 60 ]; then
  for S in 32768 65536 131072; do
    for v in $NCUVARS; do
      [ $(left) -lt 45 ] && break
      timeout 40 ncu --clock-control none -k regex:fwd_ --launch-skip 3 -c 1 --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum \
        $fwd bench $v $S 1 32 8 64 1 2>&1 | grep -E "duration|per_second|pct|sum" | sed "s/^/NCU S=$S $v /"
    done
  done > "$out/ncu.log" 2>&1
  say "ncu:"; awk '{print $2, $3, $4, $(NF-1), $(NF)}' "$out/ncu.log" >> "$out/summary.txt"
fi
if [ -n "$lib_pid" ]; then
  l=$(left)
  while kill -0 $lib_pid 2>/dev/null && [ $l -gt 40 ]; do sleep 5; l=$(left); done
  t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends  # after the build (run 1 looked before)
  if [ $l -gt 15 ] && [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
    (cd build-gpu && timeout $l ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
    say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
    grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
  else say "ctest skipped (library not built in time or no time left)"; kill $lib_pid 2>/dev/null; fi
  cat "$out/lib_build.log" >> "$out/ctest.log" 2>/dev/null && rm -f "$out/lib_build.log"
fi
say "end"
