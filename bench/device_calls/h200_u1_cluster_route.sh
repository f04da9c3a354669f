#!/usr/bin/env bash
# One call on 1 GPU (session u, 2026-11-29), issue 34: why the backend's first run of the 2-CTA
# cluster forward (call t4) ended test_backends with a segfault. First the test as it stands
# (HopperBackend.DenseForwardMeetsTheRuleAt16K on the persistent kernel): a crash there puts the
# test at fault. Then the route restored (.carry/route.patch: forward_kernel picks the cluster
# kernel at D = 128 dense from 8K full / 16K causal to 64K keys, hopper_kernels.cu instantiates it;
# the launcher now passes pointers to its arguments, 9535952), the same test under gdb for a
# backtrace if it crashes, then every test_backends case in 4 shards with the route.
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-280}
source bench/device_calls/call_start.sh 16 "test_backends"
suite test_backends 60 --gtest_filter='HopperBackend.Dense*'
cp "$out/test_backends.log" "$out/dense_at_head.log"
git apply --whitespace=nowarn ../route.patch 2>> "$out/summary.txt" || patch -p1 < ../route.patch >> "$out/summary.txt" 2>&1
say "route patch applied: $(grep -c kCluster src/kernels/hopper/hopper_args.hpp) kCluster lines"
timeout 200 cmake --build build-gpu -j 16 --target test_backends > "$out/rebuild.log" 2>&1; say "rebuild rc $?"
grep -B2 -A8 -m3 ' error' "$out/rebuild.log" | head -40 >> "$out/summary.txt"
OMP_NUM_THREADS=16 timeout 60 ./build-gpu/tests/test_backends --gtest_filter='HopperBackend.Dense*' > "$out/dense_routed.log" 2>&1
rc=$?; say "routed Dense* rc $rc: $(counts "$out/dense_routed.log")"
grep -h 'Failure\|Which is\|max error\|rule' "$out/dense_routed.log" | head -12 >> "$out/summary.txt"
if [ $rc -ne 0 ]; then
  g=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null); say "debugger: ${g:-none}"
  [ -n "$g" ] && timeout 90 "$g" -batch -ex run -ex bt -ex 'info registers rip' --args ./build-gpu/tests/test_backends \
    --gtest_filter='HopperBackend.Dense*' > "$out/gdb.log" 2>&1
  grep -A25 -m1 'SIG\|signal' "$out/gdb.log" | head -40 >> "$out/summary.txt"
  command -v compute-sanitizer > /dev/null && timeout 60 compute-sanitizer --tool memcheck ./build-gpu/tests/test_backends \
    --gtest_filter='HopperBackend.Dense*' > "$out/sanitizer.log" 2>&1; tail -30 "$out/sanitizer.log" >> "$out/summary.txt" 2>/dev/null
else
  shards test_backends 4 100
fi
say end
PACK_GLOBS="*.log *.err" pack
