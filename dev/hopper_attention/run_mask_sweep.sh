#!/usr/bin/env bash
# run_mask_sweep.sh: issue 34's mask bar over 8K-128K in one or two calls (session v): fwd+bwd of
# the pair the library's backend runs per mask (ab_masks.py's "SUMMARY backend's pair": the
# forward and backward that backend_plan's tiles pick) against compiled flex_attention on the
# same mask, and against our dense causal fwd+bwd (the forward the backend routes at that length:
# cluster192 at 8K-64K (from 16K before session w), persist192u at 128K; the backward q80), from the repository root
# on an H200 with torch; carry ["dev/hopper_attention/build/v3"] (libhopper_mask.so, built here
# with build.sh mask, stripped; LIB overrides its path). SEQS: the lengths (default 8K-128K; flex
# compiles each mask at each length, 10-60 s, so one call takes two or three lengths; CAP: seconds
# per length, default 160, 240 from 64K; 16K needed more than 160 twice).
set -u
out=${OUT:-out_sweep}; BUDGET=${BUDGET:-500}
source dev/hopper_attention/lab_call.sh
here=dev/hopper_attention; lib=${LIB:-$here/build/v3/libhopper_mask.so}
python3 -c "import ctypes; ctypes.CDLL('$lib')" || { say "carried build does not load: stop"; exit 1; }
ab() {  # ab <log> <cap> <fwd-causal> <args...>
  local log=$1 cap=$2 fc=$3; shift 3
  local l=$(left); if [ $l -lt 30 ]; then say "skipped A/B $log (no time)"; return; fi
  [ $cap -gt $l ] && cap=$l
  timeout $cap python3 $here/ab_masks.py --lib $lib --fwd persist192 --fwd-causal $fc --fwd-variants persist64 \
    --bwd-variants base,q80,short64 --causal-ref q80 "$@" > "$out/$log" 2>&1 || echo "A/B rc=$?" >> "$out/$log"
  say "A/B $log ($fc $*):"
  python3 $here/backend_pairs.py "$out/$log" >> "$out/summary.txt"  # the masks finished, if cut short too
  grep -E "Error|error|A/B rc|false" "$out/$log" | head -n 8 >> "$out/summary.txt"
}
for S in ${SEQS:-8192 16384 32768 65536 131072}; do
  fc=cluster192; [ $S -lt 8192 ] || [ $S -gt 65536 ] && fc=persist192u   # the backend's dense causal forward
  masks=docs16,docs256,window4096,window16384,bigbird; [ $S -le 16384 ] && masks=docs16,docs256,window4096,bigbird
  reps=2; [ $S -ge 65536 ] && reps=1
  ab ab_$((S / 1024))k.log ${CAP:-$(( S >= 65536 ? 240 : 160 ))} $fc --seqs $S --masks $masks --rounds 2 --reps $reps
done
say "end"
