#!/usr/bin/env bash
# Quick start, main job: sets up, builds, and runs ring attention forward + backward on 4 CPU
# ranks (threads) over a 16K-token causal sequence, checked against the fp64 oracle.
# Any arguments replace the default `seqpar attn` arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
args=("$@")
if ((${#args[@]} == 0)); then
  args=(--algo ring --layout zigzag --mask causal --seq 16384 --heads 8 --head-dim 64 --ranks 4)
fi
exec ./build/seqpar attn "${args[@]}"
