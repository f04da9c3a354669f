#!/usr/bin/env bash
# run_short_tiles.sh: the one-call GPU script of the short-tile forward (persist64:
# the persistent kernel at kC = 1 (hopper_fwd_persist.cuh; hopper_fwd_short.cuh until session u's end), 64-row query tiles x 64-key tiles, one consumer, two
# CTAs per SM; README section "Forward on 64 x 64 tiles for short lists (session u)"), from the
# repository root on an H200 with torch; carry ["dev/hopper_attention/build/short"] (built here
# beforehand with build.sh's nvcc lines: hopper_fwd_test, libhopper_mask.so; rebuilt there if they
# do not run). Steps, each capped, in the order they matter:
#   1. the lab's checks (CPU fp64 oracle, bf16 rule; each case on the full grid and on 3 CTAs):
#      persist64 on the D = 128 dense and masked cases (documents with 1-token ones, windows with
#      rows that see no key, BigBird, GQA, B = 2), persist192 on the masked ones (the control);
#      the CTAs per SM persist64's launcher found;
#   2. only if every check passes: standalone benchmask, 256 documents at 32K, persist192 /
#      persist64 / persist64 / persist192;
#   3. ab_masks.py --fwd-only (forwards alone; persist192 on its 128 x 192 lists, persist64 on its
#      64 x 64 lists, compiled flex on the same mask, and on dense causal persist192u, persist64
#      and cuDNN), with O compared against flex's over every element at each first length: 32K
#      (docs256, docs64, docs16, window1024, window4096, bigbird (128-token blocks), bigbird64),
#      128K (docs256, docs64, window1024, bigbird, bigbird64), 32K GQA 32:8 (docs256, docs64).
# Logs in $OUT; ab_masks.py prints one JSON line per mask, so a step cut by its cap keeps its
# finished masks. Each row also says the backend's choice (short_tiles_pay) (64 x 64 where persist64 computes at
# most 0.80 of persist192's scores) and the routed variant's ratios.
# Call 1: the defaults. Call 2 (masks around the rule's threshold): STANDALONE=0
#   MASKS32=window256,window512,docs128,docs32,bigbird256 MASKS64=docs128,docs64
#   MASKS128=docs512,docs128,window512 MASKSGQA= BUDGET=190
set -u
out=${OUT:-out_short}; t0=$(date +%s); deadline=$((t0 + ${BUDGET:-250}))
left() { echo $((deadline - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out"
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/summary.txt" 2>&1
say "rev $(git rev-parse --short HEAD 2>/dev/null)"
here=dev/hopper_attention; bd=$here/build/short; fwd=$bd/hopper_fwd_test; lib=$bd/libhopper_mask.so
chmod +x $fwd 2>/dev/null
if ! "$fwd" 2>&1 | grep -q usage || ! python3 -c "import ctypes; ctypes.CDLL('$lib')"; then
  say "carried build does not run here: building"
  fl=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -I src -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc)
  mkdir -p $here/build/short_there; bd=$here/build/short_there
  "$NVCC" "${fl[@]}" -o $bd/hopper_fwd_test $here/hopper_fwd_test.cu -lcuda > "$out/lab_build.log" 2>&1 &
  "$NVCC" "${fl[@]}" -shared -Xcompiler -fPIC -o $bd/libhopper_mask.so $here/hopper_mask_lib.cu -lcuda >> "$out/lab_build.log" 2>&1
  wait || say "LAB BUILD FAILED"
  fwd=$bd/hopper_fwd_test; lib=$bd/libhopper_mask.so
fi
{
  (LAB_SHORT_OCCUPANCY=1 timeout 90 $fwd check persist64 128 all > "$out/c1.tmp" 2>&1 || echo "CHECK-FAILED persist64 rc=$?" >> "$out/c1.tmp") &
  p1=$!
  (timeout 60 $fwd check persist192 128 masks > "$out/c2.tmp" 2>&1 || echo "CHECK-FAILED persist192 rc=$?" >> "$out/c2.tmp") &
  p2=$!
  wait $p1 $p2
  cat "$out/c1.tmp" "$out/c2.tmp"; rm -f "$out/c1.tmp" "$out/c2.tmp"
} > "$out/checks.log" 2>&1
say "checks: $(grep -c '^PASS' $out/checks.log) PASS, $(grep -c '^FAIL' $out/checks.log) FAIL; $(grep -E 'cases pass|CHECK-FAILED|CTAs per SM' $out/checks.log | tr '\n' ';')"
if grep -qE '^FAIL|CHECK-FAILED' "$out/checks.log" || ! grep -q 'check persist64' "$out/checks.log"; then
  grep -E '^FAIL|CHECK-FAILED|error' "$out/checks.log" | head -n 12 >> "$out/summary.txt"
  say "checks failed: no timing"; say "end"; exit 1
fi
if [ "${STANDALONE:-1}" = 1 ]; then
  for v in persist192 persist64 persist64 persist192; do
    LAB_SHORT_OCCUPANCY=1 timeout 20 $fwd benchmask $v 32768 docs:256 32 32 128 20 2>&1 | grep -E "BENCH|CTAs per SM|rror" >> "$out/bench.log"
  done
  say "standalone:"; cat "$out/bench.log" >> "$out/summary.txt"
fi
ab() {  # ab <log> <cap> <args...>
  local log=$1 cap=$2; shift 2
  local l=$(left); if [ $l -lt 25 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  timeout $cap python3 $here/ab_masks.py --lib $lib --fwd-only --fwd persist192 --fwd-causal persist192u \
    --fwd-variants persist64 "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($*):"; sed -n '/^SUMMARY/,$p' "$out/$log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error|A/B rc" "$out/$log" | head -n 24 >> "$out/summary.txt"
}
M32=${MASKS32-docs256,docs64,docs16,window1024,window4096,bigbird,bigbird64}
M64=${MASKS64-}
M128=${MASKS128-docs256,docs64,window1024,bigbird,bigbird64}
MGQA=${MASKSGQA-docs256,docs64}
[ -n "$M32" ] && ab ab_32k.log 110 --seqs 32768 --masks $M32 --rounds 3 --reps 3
[ -n "$M64" ] && ab ab_64k.log 60 --seqs 65536 --masks $M64 --rounds 3 --reps 2
[ -n "$M128" ] && ab ab_128k.log 90 --seqs 131072 --masks $M128 --rounds 2 --reps 2
[ -n "$MGQA" ] && ab ab_32k_gqa.log 60 --seqs 32768 --masks $MGQA --kv-heads 8 --rounds 3 --reps 3
say "end"
