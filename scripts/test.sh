#!/usr/bin/env bash
# Quick start, tests: sets up, builds, and runs the whole suite through ctest (CPU kernels,
# communicators, layouts, ring attention on 1-8 thread ranks, the tool, 4 MPI processes, the
# installed CMake package), again without CUDA where build/ has it, then the Python package's
# pytest suite (scripts/test_python.sh).
# SEQPAR_JOBS caps parallel build jobs and tests (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# Open MPI refuses to run as root unless told; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
(cd build && ctest --output-on-failure -j "$jobs" "$@")
# Where build/ has CUDA, the CPU tests again in a build without it (build-nocuda): the library
# and every CPU path must stand without the toolkit (SEQPAR_TEST_NOCUDA=0 skips this).
if grep -q "SEQPAR_BUILT_WITH_CUDA:INTERNAL=ON" build/CMakeCache.txt 2>/dev/null &&
   [ "${SEQPAR_TEST_NOCUDA:-1}" != 0 ]; then
  echo "[test] the CPU tests in a build without CUDA (build-nocuda)"
  cmake -S . -B build-nocuda -DCMAKE_BUILD_TYPE=Release -DSEQPAR_WITH_CUDA=OFF > build-nocuda.log 2>&1 ||
    { cat build-nocuda.log; exit 1; }
  cmake --build build-nocuda -j "$jobs" >> build-nocuda.log 2>&1 || { tail -n 60 build-nocuda.log; exit 1; }
  # The recall task's learning run (about 90 s, the same CPU code in both builds) runs once, in
  # build/, to keep CI's two-core run well inside its 30 minutes.
  (cd build-nocuda && ctest --output-on-failure -j "$jobs" -E "^Train\.RecallTaskIsLearnedAcrossRanks$" "$@")
fi
bash scripts/test_python.sh
