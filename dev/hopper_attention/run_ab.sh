#!/usr/bin/env bash
# run_ab.sh: the lab's second kind of GPU call: the CPU-reference checks of the chosen variants,
# then ab_compare.py (ours and cuDNN SDPA interleaved in one process, same inputs, plus a
# full-size correctness sample), then a short Nsight Compute reading of two variants. Logs go
# to $OUT (or ./out). Run from the repository root:
#   CHECK_VARIANTS="pingpong pp192:128 m192:64" AB_VARIANTS=pingpong,pp176 AB64_VARIANTS=pp176,m192 \
#   AB64_SEQS=8192,16384,32768 NCU_VARIANTS="" bash dev/hopper_attention/run_ab.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
here=dev/hopper_attention
out=${OUT:-$here/out}
mkdir -p "$out"
bin=$here/build/hopper_fwd_test
CHECK_VARIANTS=${CHECK_VARIANTS:-"pingpong pp176"}
AB_VARIANTS=${AB_VARIANTS:-"pingpong,pp176"}
AB64_VARIANTS=${AB64_VARIANTS:-"pingpong,pp176"}
SEQS=${SEQS:-"8192,16384,32768"}
AB64_SEQS=${AB64_SEQS:-"16384"}
NCU_VARIANTS=${NCU_VARIANTS-"pingpong pp176"}  # set to "" to skip
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  "$bin" >/dev/null 2>&1
  if [ $? -ne 2 ] || ! [ -f $here/build/libhopper_fwd.so ]; then
    echo "carried build does not run here: rebuilding"; bash $here/build.sh | grep -E "error|spill" ; fi
  for spec in $CHECK_VARIANTS; do  # name or name:D
    v=${spec%%:*}; d=${spec#*:}; [ "$d" = "$spec" ] && d=0
    timeout 120 "$bin" check "$v" "$d" || echo "CHECK-FAILED $spec rc=$?"; done
  timeout 300 python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so --seqs "$SEQS" --variants "$AB_VARIANTS" \
    --kv-heads 32,8 --dim 128
  timeout 120 python3 $here/ab_compare.py --lib $here/build/libhopper_fwd.so --seqs "$AB64_SEQS" --variants "$AB64_VARIANTS" \
    --kv-heads 32 --dim 64
  if command -v ncu >/dev/null; then
    for v in $NCU_VARIANTS; do for c in 0 1; do
      timeout 60 ncu -k regex:fwd_kernel -c 1 --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
        "$bin" bench "$v" 8192 "$c" 32 32 128 1 2>&1 | grep -E "fwd_kernel|duration|per_second|pct|BENCH" | sed "s/^/NCU $v causal=$c /"
    done; done
  fi
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$out/run_ab.log"
echo "==== summary"; grep -E "check .*cases pass|CHECK-FAILED|FAIL |^AB |CHECKBIG" "$out/run_ab.log"
