#!/usr/bin/env bash
# Quick start, main job: sets up, builds, and trains the tiny LLaMA-style model on the embedded
# recall task with each 256-token sequence split over 2 CPU ranks (threads): the loss falls from
# ln 8 = 2.08 towards 0 only because attention reaches across the ranks. Writes the loss curve
# to build/train_loss.svg. Any arguments replace the default ones and go to `seqpar` as they
# are (e.g. `bash scripts/run.sh attn --seq 16384 --ranks 4`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
args=("$@")
if ((${#args[@]} == 0)); then
  args=(train --ranks 2 --seq 256 --batch 32 --steps 250 --plot build/train_loss.svg)
fi
exec ./build/seqpar "${args[@]}"
