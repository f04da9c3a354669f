#!/usr/bin/env bash
# On the GPU machine (H200, CUDA 13, sm_90a): the linear-attention kernels alone. Builds only
# test_gpu_linear and bench_gpu_linear into build-gpu through scripts/gpu_check.sh (same cmake
# flags, same carried .carry deps), then runs the named stages; logs and JSON lines go to $OUT
# (or ./gpu_out). Meant to finish in under 8 minutes (each stage has its own timeout).
#   tests   test_gpu_linear (GPU cases, their host replay, the rule's own tests)
#   bench   bench_gpu_linear: ours (one tile stage, pipelined), B=1 H=16 d=128, N from 8K until
#           the tensors do not fit
#   peer    bench/fla_linear_peer.py (chunk_simple_gla), then the table of both
# Usage: bash scripts/lasp_gpu_check.sh [tests] [bench] [peer]   (none: all three)
# SEQS overrides the lengths; ITERS the timed iterations (default 3); PEER_TIMEOUT the fla
# peer's seconds (default 400: its Triton autotuning compiles many kernels at first use). The fla wheels (README,
# "GPUs") are taken from .whl/ or .carry/whl/ when fla is not importable.
set -uo pipefail
cd "$(dirname "$0")/.."
stages="${*:-tests bench peer}"
out="${OUT:-gpu_out}"
mkdir -p "$out"
seqs="${SEQS:-8192,32768,131072,524288,1048576,2097152,4194304,8388608}"
iters="${ITERS:-3}"
start=$SECONDS
BUILD_TARGETS="test_gpu_linear bench_gpu_linear" timeout 300 bash scripts/gpu_check.sh build || {
  echo "build failed (see $out/build.log)"; exit 1; }
echo "built in $((SECONDS - start)) s"
status=0
for stage in $stages; do
  case "$stage" in
    tests)
      OMP_NUM_THREADS=16 timeout 150 ./build-gpu/tests/test_gpu_linear --gtest_brief=1 2>&1 | tee "$out/linear_tests.log" | tail -n 30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    bench)
      timeout 120 ./build-gpu/bench_gpu_linear --json --iters "$iters" --seqs "$seqs" 2>&1 | tee "$out/linear_ours.jsonl"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    peer)
      if ! python3 -c "import fla.ops.simple_gla" 2>/dev/null; then
        site="$PWD/.carry/fla_site"
        wheels=$(ls .whl/*.whl .carry/whl/*.whl 2>/dev/null)
        [ -n "$wheels" ] && python3 -m pip install -q --no-deps --no-index --target "$site" $wheels
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
      fi
      (cd bench && timeout "${PEER_TIMEOUT:-400}" python3 -u fla_linear_peer.py --iters "$iters" --seqs "$seqs") \
        2> >(tee "$out/linear_fla_progress.txt" >&2) | tee "$out/linear_fla.jsonl"
      [ -f "$out/linear_ours.jsonl" ] && python3 bench/compare_linear.py "$out/linear_ours.jsonl" "$out/linear_fla.jsonl" | tee "$out/linear_compare.md" ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
  echo "[$stage done at $((SECONDS - start)) s]"
done
exit $status
