#!/usr/bin/env bash
# build.sh: builds the lab's drivers with plain nvcc for sm_90a into dev/hopper_attention/build/
# (ignored by git through the root .gitignore's build/): the forward's check/bench driver
# (hopper_fwd_test) and ctypes library (libhopper_fwd.so), the backward's (hopper_bwd_test,
# libhopper_bwd.so), and the masks' ctypes library for ab_masks.py (libhopper_mask.so). Writes
# ptxas' resource usage (registers, spills) to build/ptxas*.txt. The builds run in parallel.
# Usage: bash dev/hopper_attention/build.sh [fwd|bwd|mask]   (from anywhere; default all)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
what=${1:-all}
mkdir -p "$here/build"
# The kernels are the library's: src/ on the include path (kernels/hopper/*.cuh).
flags=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -I "$here/../../src"
       -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc)
nvcc=${NVCC:-nvcc}
pids=()
if [ "$what" = all ] || [ "$what" = fwd ]; then
  "$nvcc" "${flags[@]}" --resource-usage -Xcompiler -O2 \
    -o "$here/build/hopper_fwd_test" "$here/hopper_fwd_test.cu" -lcuda > "$here/build/ptxas.txt" 2>&1 & pids+=($!)
  # The same kernels as a shared library for ab_compare.py (ctypes).
  "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC \
    -o "$here/build/libhopper_fwd.so" "$here/hopper_fwd_lib.cu" -lcuda & pids+=($!)
fi
if [ "$what" = all ] || [ "$what" = bwd ]; then
  # The backward's driver (it also instantiates the forward variants, for O and LSE in bench).
  "$nvcc" "${flags[@]}" --resource-usage -Xcompiler -O2 \
    -o "$here/build/hopper_bwd_test" "$here/hopper_bwd_test.cu" -lcuda > "$here/build/ptxas_bwd.txt" 2>&1 & pids+=($!)
  "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC \
    -o "$here/build/libhopper_bwd.so" "$here/hopper_bwd_lib.cu" -lcuda & pids+=($!)
fi
if [ "$what" = all ] || [ "$what" = mask ]; then
  "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC \
    -o "$here/build/libhopper_mask.so" "$here/hopper_mask_lib.cu" -lcuda & pids+=($!)
fi
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
grep -hE "error|spill stores" "$here"/build/ptxas*.txt | sort | uniq -c || true
exit $status
