#!/usr/bin/env bash
# Copies what the build needs from this machine's OS packages into .carry/deps/usr, for the
# GPU machine, which cannot download: GoogleTest (static libs), CLI11 and nlohmann-json
# (header-only), with their CMake package files (which locate files relative to themselves),
# OpenBLAS (the training engine's CPU products: the shared library, its Fortran runtime and the
# CBLAS headers, found there by CMake's FindBLAS), plus the cuDNN frontend headers in
# .carry/cudnn_frontend and nanobind's wheel in .carry/whl (scripts/torch_gpu_check.sh builds
# the Python module there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/fetch_cudnn_frontend.sh
dest=.carry/deps/usr
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib/x86_64-linux-gnu/cmake" "$dest/share/cmake"
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/gtest /usr/include/gmock "$dest/include/"
cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$dest/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$dest/lib/x86_64-linux-gnu/cmake/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$dest/share/cmake/"
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
cp "$blas/libopenblasp-r0.3.21.so" "$dest/lib/x86_64-linux-gnu/libopenblas.so.0"
ln -sf libopenblas.so.0 "$dest/lib/x86_64-linux-gnu/libopenblas.so"
cp -L /lib/x86_64-linux-gnu/libgfortran.so.5 /lib/x86_64-linux-gnu/libquadmath.so.0 "$dest/lib/x86_64-linux-gnu/"
cp /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h \
   "$dest/include/"
mkdir -p .carry/whl
python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/whl nanobind
du -sh .carry
# The code to compare against, for two_gpu_runs.sh's regress stage, which builds its benchmark
# beside ours on the GPU machine: the hand-written two-rank path before the executor redesign
# (7e6f94d, the parent of f9a93a7), or BEFORE=<commit>.
rm -rf .carry/oldpath && mkdir -p .carry/oldpath
git archive "${BEFORE:-7e6f94d}" CMakeLists.txt apps bench include scripts src tests $(git ls-tree --name-only "${BEFORE:-7e6f94d}" cmake) | tar -x -C .carry/oldpath
du -sh .carry
