#!/usr/bin/env bash
# Quick start, tests: sets up, builds, and runs the whole suite through ctest (CPU kernels,
# communicators, layouts, ring attention on 1-8 thread ranks, the tool, 4 MPI processes, the
# installed CMake package), builds the library and tool again without CUDA where build/ has it
# (and runs the tool there), then the Python package's pytest suite (scripts/test_python.sh).
# SEQPAR_JOBS caps parallel build jobs and tests (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# Open MPI refuses to run as root unless told; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
(cd build && ctest --output-on-failure -j "$jobs" "$@")
# Where build/ has CUDA, the library and the tool again in a build without it (build-nocuda):
# they must stand without the toolkit (SEQPAR_TEST_NOCUDA=0 skips this). The CPU tests ran above
# on the same sources; here the tool trains and checks attention on CPU ranks and refuses
# --device cuda with the reason. CI's two cores cannot afford the whole suite twice in 30 min.
if grep -q "SEQPAR_BUILT_WITH_CUDA:INTERNAL=ON" build/CMakeCache.txt 2>/dev/null &&
   [ "${SEQPAR_TEST_NOCUDA:-1}" != 0 ]; then
  echo "[test] the library and the tool in a build without CUDA (build-nocuda)"
  cmake -S . -B build-nocuda -DCMAKE_BUILD_TYPE=Release -DSEQPAR_WITH_CUDA=OFF -DSEQPAR_BUILD_TESTS=OFF \
    > build-nocuda.log 2>&1 || { cat build-nocuda.log; exit 1; }
  cmake --build build-nocuda -j "$jobs" --target seqpar_cli >> build-nocuda.log 2>&1 ||
    { tail -n 60 build-nocuda.log; exit 1; }
  ./build-nocuda/seqpar train --ranks 2 --steps 3 --threads-per-rank 1 > /dev/null
  ./build-nocuda/seqpar attn --seq 333 --ranks 3 --mask docs:4 --layout documents --check full > /dev/null
  if ./build-nocuda/seqpar train --device cuda --steps 1 > /dev/null 2> build-nocuda.err; then
    echo "[test] build-nocuda trained on --device cuda" >&2; exit 1
  fi
  grep -q "CUDA" build-nocuda.err || { cat build-nocuda.err; exit 1; }
  echo "[test] build-nocuda: trains and checks on CPU ranks, refuses --device cuda"
fi
bash scripts/test_python.sh
