#!/usr/bin/env bash
# One call on 1 GPU (session u, 2026-11-29), issue 34: the short-tile forward (64 x 64 tiles, two
# CTAs per SM, hopper_fwd_short.cuh) routed by the backend where short_tiles_pay says so. First
# test_backends in 4 shards: every masked D = 128 shard-pair case now runs the short-tile kernel
# through the backend but docs_full_long_d128_mqa (the persistent kernel with lists), each step
# kind under the bf16 rule against the fp64 oracle. Then the lab's A/B (ab_masks.py; carried
# dev/hopper_attention/build/u3/libhopper_mask.so, built here with build.sh mask) fwd+bwd against
# compiled flex on the masks the rule sends to the short kernel: persist64's forward on its own
# lists then the backward the backend routes, timed as one pass, beside persist192 + that
# backward, interleaved in one process.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-330}
source bench/device_calls/call_start.sh 16 "test_backends"
shards test_backends 4 110
lib=$root/dev/hopper_attention/build/u3/libhopper_mask.so
ab() {  # ab TAG CAP ARGS...: ab_masks.py fwd+bwd into $out/ab_TAG.log
  local tag=$1 cap=$2; shift 2
  local l=$(left); [ $l -lt 40 ] && { say "out of time before A/B $tag"; return 9; }
  timeout $(( l - 15 < cap ? l - 15 : cap )) python3 dev/hopper_attention/ab_masks.py --lib $lib --fwd persist192 \
    --fwd-causal persist192u --fwd-variants persist64 --bwd-variants base,q80 "$@" > "$out/ab_$tag.log" 2>&1
  say "A/B $tag rc $? ($*)"
  grep -E "check_vs_flex" "$out/ab_$tag.log" | cut -c1-220 | head -8 >> "$out/summary.txt"
  python3 - "$out/ab_$tag.log" >> "$out/summary.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"): continue
    r = json.loads(line)
    if "flex_fb_tflops" not in r: continue
    fb = {k[:-7]: v for k, v in r.items() if k.startswith("ours_fb_") and k.endswith("_tflops")}
    fw = {k[:-7]: v for k, v in r.items() if k.startswith("ours_fwd") and k.endswith("_tflops")}
    print("%s S=%d routed=%s flex fwd %.1f fb %.1f | fwd %s | fb %s" % (r["mask"], r["seq"], r.get("routed"),
          r["flex_fwd_tflops"], r["flex_fb_tflops"], fw, fb))
PY
}
ab 32k 150 --seqs 32768 --masks docs256,docs64,bigbird,window512 --rounds 3 --reps 2
ab 128k 90 --seqs 131072 --masks docs256 --rounds 2 --reps 1
say end
PACK_GLOBS="*.log *.err" pack
