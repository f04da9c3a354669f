#!/usr/bin/env bash
# Configures and builds seqpar into build/ (Release). Extra arguments go to cmake.
# SEQPAR_JOBS caps the parallel build jobs (default: every core); SEQPAR_CUDA_ARCHITECTURES
# replaces the default CUDA targets (90a and 80).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
  ${SEQPAR_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES="$SEQPAR_CUDA_ARCHITECTURES"} "$@"
cmake --build build -j "$jobs"
