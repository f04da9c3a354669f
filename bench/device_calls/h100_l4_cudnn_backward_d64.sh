#!/usr/bin/env bash
# One call on one GPU (session l, 2026-11-28): auto's backward on cuDNN at head dim 64 (issue 34's
# per-call table; issue 36's 1B preset, whose heads are 64 wide), where the step profile showed
# the attention at the Hopper D = 64 backward's rate.
#  1. build; test_backends (every backend against the fp64 oracle, the O-taking auto among them;
#     AutoBackend.*)
#  2. the 1B preset on one GPU at 32K and 64K tokens, --profile: auto (cuDNN's backward at D = 64)
#     against SEQPAR_ATTN_BACKEND=hopper (the Hopper kernels both ways: what auto ran before), in
#     turn, two rounds
set -u
CALL_BUDGET_S=420
source bench/device_calls/call_start.sh 16 "test_backends seqpar_cli"
timeout 120 ./build-gpu/tests/test_backends > "$out/test_backends.log" 2>&1
say "test_backends rc $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/test_backends.log" | tr '\n' ' ') $(grep -E '^\[  FAILED' "$out/test_backends.log" | head -5 | tr '\n' ' ')"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train() {  # seq tag [env...]
  local S=$1 tag=$2; shift 2
  local l=$(left); [ $l -lt 30 ] && { say "out of time before $tag"; return 9; }
  env "$@" timeout $(( l - 10 < 60 ? l - 10 : 60 )) ./build-gpu/seqpar train --device cuda --gpus 1 --model 1b \
    --data "text:$txt" --seq $S --batch 1 --steps 4 --warmup 1 --checkpointing attention --profile --json \
    >> "$out/$tag.jsonl" 2>> "$out/$tag.err"
  say "$tag rc $? $(tail -n 1 "$out/$tag.jsonl" | head -c 700)"
}
for round in 1 2; do
  for S in 32768 65536; do
    train $S auto_$S SEQPAR_UNUSED=1
    train $S hopper_$S SEQPAR_ATTN_BACKEND=hopper
  done
done
say end
pack
