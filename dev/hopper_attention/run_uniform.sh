#!/usr/bin/env bash
# run_uniform.sh: the second one-call GPU script of the forward's issue-34 work on the persistent
# kernel (README sections "Fused tile boundary" and "Uniform descriptors"), from the repository
# root on an H100/H200 with torch; carry [".carry/deps", ".carry/cudnn_frontend", ".carry/whl",
# ".carry/oldpath", "dev/hopper_attention/build"] (the lab's build from here; rebuilt if it does
# not run). Steps: the library's test_backends built in the background; the checks (CPU fp64
# oracle, dense and masked; persistent variants on their full grid and on 3 CTAs) of VARS /
# VARS64; SM clock sampled (nvidia-smi, 20 ms) during standalone benches of CLOCKVARS at 32K dense
# full (100 launches each, A B B A); ab_compare.py: AB / AB64 at 8K-32K, ROUTE (dense full
# routing) at 12K and 24K, AB64K / AB64K64 at 64K; the backend's ctest cases in the time left.
# Logs in $OUT (8 files: the library build's log is appended to ctest.log).
set -u
out=${OUT:-out_uniform}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-330}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
VARS=${VARS:-"pp192u persist192u persist192xu"}
VARS64=${VARS64:-"m192u persist_m192u persist_m192xu"}
CLOCKVARS=${CLOCKVARS:-"pp192 persist192"}
AB=${AB:-pp192,pp192u,persist192,persist192u,persist192xu}
AB64=${AB64:-m192,persist_m192,persist_m192u,persist_m192xu}
ROUTE=${ROUTE:-pp192,pp192u,persist192,persist192u}
AB64K=${AB64K:-pp192,pp192u,persist192,persist192u}
AB64K64=${AB64K64:-persist_m192,persist_m192u}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
(
  source scripts/gpu_env.sh
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF \
    -DCMAKE_LIBRARY_PATH="$lib_path" -DCMAKE_INCLUDE_PATH="$inc_path" 2>&1 | grep -E "seqpar|Error|error"
  nice cmake --build build-gpu -j 24 --target test_backends 2>&1 | grep -E "warning|error|Linking|spill" | tail -n 30
) > "$out/lib_build.log" 2>&1 &
lib_pid=$!
here=dev/hopper_attention; fwd=$here/build/hopper_fwd_test
if ! "$fwd" 2>&1 | grep -q usage || ! python3 -c "import ctypes; ctypes.CDLL('$here/build/libhopper_fwd.so')"; then
  say "carried build does not run here: building"
  bash $here/build.sh fwd >> "$out/lib_build.log" 2>&1 || say "LAB BUILD FAILED"
fi
say "lab ready: $(grep -h 'spill stores' $here/build/ptxas.txt | grep -vc ' 0 bytes spill') ptxas lines with spills"
{
  for v in $VARS; do timeout 120 $fwd check $v 128 all || echo "CHECK-FAILED fwd $v"; done
  for v in $VARS64; do timeout 120 $fwd check $v 64 all || echo "CHECK-FAILED fwd $v"; done
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED' $out/checks.log | tr '\n' ';')"
nvidia-smi -i "${CUDA_VISIBLE_DEVICES%%,*}" --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 20 > "$out/clocks.csv" 2>&1 &
smi=$!
sleep 1
{
  for v in $CLOCKVARS $(echo $CLOCKVARS | tr ' ' '\n' | tac); do
    echo "WINDOW $v start $(date '+%Y/%m/%d %H:%M:%S.%N')"
    timeout 30 $fwd bench $v 32768 0 32 32 128 100 || echo "BENCH-FAILED $v"
    echo "WINDOW $v end $(date '+%Y/%m/%d %H:%M:%S.%N')"
    sleep 2
  done
} > "$out/bench.log" 2>&1
kill $smi 2>/dev/null; wait $smi 2>/dev/null
python3 $here/clocks.py "$out/bench.log" "$out/clocks.csv" >> "$out/summary.txt" 2>&1
say "clock benches done"
ab() {  # ab LOG TIMEOUT args...: ab_compare.py appended to $out/LOG, its AB lines to the summary
  local log=$1 t=$2; shift 2
  local l=$(left); if [ $l -lt 20 ]; then say "skipped A/B $* (no time)"; return; fi
  [ $t -gt $l ] && t=$l
  local before=$(cat "$out/$log" 2>/dev/null | wc -l)
  timeout $t python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so "$@" >> "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $*:"
  tail -n +$((before + 1)) "$out/$log" | grep -E "^AB |CHECKBIG|A/B rc|Error" | sed 's/ (min [0-9.]* max [0-9.]*)//' >> "$out/summary.txt"
}
ab ab128.log 120 --seqs 8192,16384,32768 --variants $AB --kv-heads 32,8 --dim 128 --rounds 8 --reps 4
ab ab64.log 90 --seqs 8192,16384,32768 --variants $AB64 --kv-heads 32,8 --dim 64 --rounds 8 --reps 4
ab ab128.log 60 --seqs 12288,24576 --variants $ROUTE --kv-heads 32,8 --dim 128 --rounds 8 --reps 4 --check-rows 0
ab ab64k.log 100 --seqs 65536 --variants $AB64K --kv-heads 32,8 --dim 128 --rounds 5 --reps 3 --check-rows 0
ab ab64k.log 60 --seqs 65536 --variants $AB64K64 --kv-heads 32,8 --dim 64 --rounds 5 --reps 3 --check-rows 0
t=build-gpu/tests/test_backends; [ -x $t ] || t=build-gpu/test_backends
l=$(left)
if [ $l -gt 15 ] && [ -x $t ] && ! kill -0 $lib_pid 2>/dev/null; then
  (cd build-gpu && timeout $l ctest --output-on-failure -j 4 -R "BackendVsOracle|HopperBackend" 2>&1) > "$out/ctest.log" 2>&1
  say "ctest: $(grep -E 'tests passed|tests failed' $out/ctest.log | tr '\n' ' ')"
  grep -E "Failed|\*\*\*" "$out/ctest.log" | head -n 20 >> "$out/summary.txt"
else say "ctest skipped (library not built in time or no time left)"; kill $lib_pid 2>/dev/null; fi
cat "$out/lib_build.log" >> "$out/ctest.log" 2>/dev/null && rm -f "$out/lib_build.log"  # at most 8 files come back
say "end"
