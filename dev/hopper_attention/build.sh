#!/usr/bin/env bash
# build.sh: builds the lab's drivers with plain nvcc for sm_90a into dev/hopper_attention/build/
# (ignored by git through the root .gitignore's build/): the forward's check/bench driver
# (hopper_fwd_test) and ctypes library (libhopper_fwd.so), and the backward's (hopper_bwd_test,
# libhopper_bwd.so). Writes ptxas' resource usage (registers, spills) to build/ptxas*.txt.
# Usage: bash dev/hopper_attention/build.sh [fwd|bwd]   (from anywhere; default both)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
what=${1:-all}
mkdir -p "$here/build"
# The kernels are the library's: src/ on the include path (kernels/hopper/*.cuh).
flags=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -I "$here/../../src"
       -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc)
if [ "$what" != bwd ]; then
  nvcc "${flags[@]}" --resource-usage -Xcompiler -O2 \
    -o "$here/build/hopper_fwd_test" "$here/hopper_fwd_test.cu" -lcuda 2>&1 | tee "$here/build/ptxas.txt"
  # The same kernels as a shared library for ab_compare.py (ctypes).
  nvcc "${flags[@]}" -shared -Xcompiler -fPIC \
    -o "$here/build/libhopper_fwd.so" "$here/hopper_fwd_lib.cu" -lcuda
fi
if [ "$what" != fwd ]; then
  # The backward's driver (it also instantiates the forward variants, for O and LSE in bench).
  nvcc "${flags[@]}" --resource-usage -Xcompiler -O2 \
    -o "$here/build/hopper_bwd_test" "$here/hopper_bwd_test.cu" -lcuda 2>&1 | tee "$here/build/ptxas_bwd.txt"
  nvcc "${flags[@]}" -shared -Xcompiler -fPIC \
    -o "$here/build/libhopper_bwd.so" "$here/hopper_bwd_lib.cu" -lcuda
fi
