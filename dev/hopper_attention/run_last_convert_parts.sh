#!/usr/bin/env bash
# run_last_convert_parts.sh: where short64c's time goes (session w, second call): the whole backward
# alone (benchmask, 256 documents, H = 32, D = 128) of short64 (6) and of short64c (7) with its
# parts switched off by the lab's knobs: LAB_KEEP_LINES=1 (no L2 discard), LAB_CONVERT_CAP=0 (the
# counts only, every tile converted by the rest kernel), in a mirrored order; after the checks at caps 0, 1, 63.
# From the repository root on an H200; carry ["dev/hopper_attention/build/w2"] (hopper_bwd_test).
set -u
out=${OUT:-out_lastconv_parts}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
bwd=${BWD:-dev/hopper_attention/build/w2/hopper_bwd_test}; chmod +x $bwd
for cap in 0 1 63; do
  LAB_CONVERT_CAP=$cap timeout 60 $bwd check 128 short64c masks 2>&1 | grep -E "^FAIL|cases pass" | sed "s/^/cap $cap: /" | tee -a $out/checks.log
done
run() {  # run <S> <tag> <variant> [env...]
  local S=$1 tag=$2 v=$3; shift 3
  env "$@" timeout 30 $bwd benchmask $S docs:256 32 32 128 20 $v 2>&1 | grep -E "BENCH|rror" | sed "s/^/S=$S $tag /" >> "$out/bench.log"
}
for S in ${SEQS:-32768 131072}; do
  run $S short64 6; run $S c 7; run $S c_keep 7 LAB_KEEP_LINES=1; run $S c_count 7 LAB_CONVERT_CAP=0
  run $S c_count 7 LAB_CONVERT_CAP=0; run $S c_keep 7 LAB_KEEP_LINES=1; run $S c 7; run $S short64 6
done
grep BENCHMASK $out/bench.log | sed -E 's/ \(min [0-9.]* max [0-9.]*\)//; s/BENCHMASK bwd variant=[0-9] S=[0-9]* mask=docs:256 H=32 Hkv=32 D=128 //'
