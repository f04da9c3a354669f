#!/usr/bin/env bash
# run_open_cells.sh: issue 34's cells not measured yet or measured before a routing change (session
# w), from the repository root on an H200 with torch; carry ["dev/hopper_attention/build/w3"]
# (libhopper_fwd.so and libhopper_mask.so, built here with build.sh fwd and mask, stripped):
#   1. the dense D = 128 causal forward at 8K, the cluster kernel (cluster192, routed from 16K keys
#      only) against the kernel the backend runs there (persist192u) and cuDNN, 32:32 and 32:8
#      (ab_compare.py, interleaved, full-size row checks);
#   2. the mask bar at 8K again (the 4K window now on q80 under the 3% rule, 16 documents, BigBird)
#      and at 128K for the two masks never measured there (the 16K window, BigBird): ab_masks.py,
#      the backend's pair per mask against compiled flex (backend_pairs.py prints it).
set -u
out=${OUT:-out_cells}; BUDGET=${BUDGET:-420}
source dev/hopper_attention/lab_call.sh
bd=${BUILD:-$here/build/w3}
timeout 90 python3 $here/ab_compare.py --lib $bd/libhopper_fwd.so --seqs ${FWD_SEQS:-8192} --variants persist192u,cluster192 \
  --kv-heads 32,8 --causal 1 --rounds 6 --reps 3 > "$out/fwd_8k.log" 2>&1 || echo "rc=$?" >> "$out/fwd_8k.log"
say "forward, causal D = 128:"; grep -vE "^\s*$|Warning|warn" "$out/fwd_8k.log" | tail -n 14 >> "$out/summary.txt"
ab() {  # ab <log> <cap> <fwd-causal> <args...>
  local log=$1 cap=$2 fc=$3; shift 3
  local l=$(left); if [ $l -lt 30 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  timeout $cap python3 $here/ab_masks.py --lib $bd/libhopper_mask.so --fwd persist192 --fwd-causal $fc --fwd-variants persist64 \
    --bwd-variants base,q80,short64 --causal-ref q80 "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($fc $*):"
  python3 $here/backend_pairs.py "$out/$log" >> "$out/summary.txt"
  grep -E "Error|error|A/B rc|false" "$out/$log" | head -n 8 >> "$out/summary.txt"
}
ab ab_8k.log 120 persist192u --seqs 8192 --masks ${MASKS8:-window4096,docs16,bigbird} --rounds 3 --reps 2
ab ab_128k.log 260 persist192u --seqs 131072 --masks ${MASKS128:-window16384,bigbird} --rounds 2 --reps 1
say "end"
