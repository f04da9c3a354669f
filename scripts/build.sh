#!/usr/bin/env bash
# Configures and builds seqpar into build/ (Release). Extra arguments go to cmake.
# SEQPAR_JOBS caps the parallel build jobs (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
