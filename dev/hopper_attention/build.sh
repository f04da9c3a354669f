#!/usr/bin/env bash
# build.sh: builds the lab's check/bench driver (hopper_fwd_test) with plain nvcc for sm_90a,
# into dev/hopper_attention/build/ (ignored by git through the root .gitignore's build/).
# Prints ptxas' resource usage (registers, spills, shared memory) for every kernel.
# Usage: bash dev/hopper_attention/build.sh   (from anywhere)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/build"
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo --resource-usage \
  -Xcompiler -O2 -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc \
  -o "$here/build/hopper_fwd_test" "$here/hopper_fwd_test.cu" -lcuda 2>&1 | tee "$here/build/ptxas.txt"
# The same kernels as a shared library for ab_compare.py (ctypes); device code only once per
# variant, so this doubles the build time (about 15 s here).
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -shared -Xcompiler -fPIC \
  -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc \
  -o "$here/build/libhopper_fwd.so" "$here/hopper_fwd_lib.cu" -lcuda
