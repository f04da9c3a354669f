#!/usr/bin/env bash
# One call on 1 GPU (session v, 2026-11-29), issue 34: the short-tile backward (short64: 64-key
# tiles, one consumer warpgroup, two CTAs per SM; hopper_bwd_short.cuh) routed by the backend where
# short_bwd_pays says so (its lists compute at most 0.85 of base's scores). First test_backends in
# 4 shards: the masked D = 128 shard-pair cases now run short64 through the backend but
# docs_full_q80's second pair (q80) and window_300_0_base (base), each step kind under the bf16
# rule against the fp64 oracle. Then the lab's A/B (ab_masks.py; carried
# dev/hopper_attention/build/v1/libhopper_mask.so, built here with build.sh mask) fwd+bwd against
# compiled flex on the masks the rule newly sends to short64 (128 documents, a 256 window, BigBird
# of 64-token blocks at 32K; 512 documents at 128K) and on 256 documents (32K, 128K): persist64's
# forward then base and then short64, interleaved in one process; "routed" names the backend's.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-400}
source bench/device_calls/call_start.sh 16 "test_backends"
shards test_backends 4 110
lib=$root/dev/hopper_attention/build/v1/libhopper_mask.so
ab() {  # ab TAG CAP ARGS...: ab_masks.py fwd+bwd into $out/ab_TAG.log
  local tag=$1 cap=$2; shift 2
  local l=$(left); [ $l -lt 40 ] && { say "out of time before A/B $tag"; return 9; }
  timeout $(( l - 15 < cap ? l - 15 : cap )) python3 dev/hopper_attention/ab_masks.py --lib $lib --fwd persist192 \
    --fwd-causal persist192u --fwd-variants persist64 --bwd-variants base,short64 --causal-ref base --fb-all "$@" \
    > "$out/ab_$tag.log" 2>&1
  say "A/B $tag rc $? ($*)"
  sed -n '/^SUMMARY per backward/,$p' "$out/ab_$tag.log" >> "$out/summary.txt"
  grep -E "check_vs_flex|Error|error" "$out/ab_$tag.log" | cut -c1-220 | head -12 >> "$out/summary.txt"
  python3 - "$out/ab_$tag.log" >> "$out/summary.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"): continue
    r = json.loads(line)
    if "flex_fb_tflops" not in r: continue
    t = {k[:-7]: v for k, v in r.items() if k.startswith("ours_") and k.endswith("_tflops")}
    print("%s S=%d routed=%s flex fwd %.1f fb %.1f | %s" % (r["mask"], r["seq"], r.get("routed"),
          r["flex_fwd_tflops"], r["flex_fb_tflops"], t))
PY
}
ab 32k 170 --seqs 32768 --masks docs128,window256,bigbird64,docs256 --rounds 3 --reps 2
ab 128k 100 --seqs 131072 --masks docs512,docs256 --rounds 2 --reps 1 --skip-causal
say end
PACK_GLOBS="*.log *.err" pack
