#!/usr/bin/env bash
# run_bwd.sh: the backward's one-call GPU session: the CPU-oracle checks of each variant (D = 128,
# then 64), a standalone timing of our backward, then ab_bwd.py (ours and cuDNN SDPA's backward
# interleaved in one process, plus full-size checks) over the variants whose checks passed. Each
# step runs under a timeout. Logs go to $OUT/run_bwd.log (or ./out). From the repository root:
#   SEQS=8192,16384,32768 KV_HEADS=32,8 AB64_SEQS=8192,16384 bash dev/hopper_attention/run_bwd.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
here=dev/hopper_attention
out=${OUT:-$here/out}
mkdir -p "$out"
bin=$here/build/hopper_bwd_test
SEQS=${SEQS:-"8192,16384,32768"}
KV_HEADS=${KV_HEADS:-32}
VARIANTS=${VARIANTS:-"base defer"}
AB_TIMEOUT=${AB_TIMEOUT:-150}
AB64_SEQS=${AB64_SEQS-"8192,16384"}  # D = 64 A/B ("" to skip)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  "$bin" >/dev/null 2>&1
  if [ $? -ne 2 ] || ! [ -f $here/build/libhopper_bwd.so ] || ! [ -f $here/build/libhopper_fwd.so ]; then
    echo "carried build does not run here: rebuilding"; bash $here/build.sh | grep -E "error|spill" ; fi
  passed=""
  for v in $VARIANTS; do
    timeout 60 "$bin" check 128 $v && timeout 30 "$bin" check 64 $v && passed="$passed,$v" \
      || echo "CHECK-FAILED $v rc=$?"
  done
  passed=${passed#,}
  echo "variants that passed: $passed"
  if [ -n "$passed" ]; then
    for c in 0 1; do timeout 30 "$bin" bench 8192 $c 32 32 128 5 0 || echo "BENCH-FAILED"; done
    timeout $AB_TIMEOUT python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so \
      --bwd-lib $here/build/libhopper_bwd.so --seqs "$SEQS" --kv-heads "$KV_HEADS" --dim 128 \
      --variants "$passed" ${AB_ARGS:-}
    [ -n "$AB64_SEQS" ] && timeout 60 python3 $here/ab_bwd.py --fwd-lib $here/build/libhopper_fwd.so \
      --bwd-lib $here/build/libhopper_bwd.so --seqs "$AB64_SEQS" --kv-heads 32 --dim 64 --variants "$passed"
  fi
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$out/run_bwd.log"
echo "==== summary"; grep -E "cases pass|CHECK-FAILED|^FAIL|variants that|^BENCH|CHECKALL|CHECKREF|^SUMMARY" "$out/run_bwd.log"
