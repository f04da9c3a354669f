#!/usr/bin/env bash
# The CMake package end to end: installs this build into a fresh prefix, then configures, builds
# and runs examples/find_package against it, as another project would.
# Usage: find_package_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CXX_COMPILER
set -euo pipefail
cmake_bin=$1 build_dir=$2 source_dir=$3 work_dir=$4 cxx=$5
rm -rf "$work_dir"
mkdir -p "$work_dir"
"$cmake_bin" --install "$build_dir" --prefix "$work_dir/prefix" >"$work_dir/install.log"
test -f "$work_dir/prefix/lib/cmake/seqpar/seqparConfig.cmake" || test -f "$work_dir/prefix/lib64/cmake/seqpar/seqparConfig.cmake"
"$cmake_bin" -S "$source_dir/examples/find_package" -B "$work_dir/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work_dir/prefix" -DCMAKE_CXX_COMPILER="$cxx" >"$work_dir/configure.log"
"$cmake_bin" --build "$work_dir/build" -j 1 >"$work_dir/build.log"
"$work_dir/build/ring_two_ranks"
