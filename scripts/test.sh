#!/usr/bin/env bash
# Quick start, tests: sets up, builds, and runs the whole suite through ctest (CPU kernels,
# communicators, layouts, ring attention on 1-8 thread ranks, the tool, 4 MPI processes, the
# installed CMake package), then the Python package's pytest suite (scripts/test_python.sh).
# SEQPAR_JOBS caps parallel build jobs and tests (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# Open MPI refuses to run as root unless told; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd build && ctest --output-on-failure -j "${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}" "$@")
bash scripts/test_python.sh
