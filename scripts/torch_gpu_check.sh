#!/usr/bin/env bash
# On one GPU (the H200 machine, no network): builds seqpar's Python module with CUDA, cuDNN and
# NCCL into build-gpu-py (the carried dependencies, found as scripts/gpu_check.sh finds them),
# stages it with the Python package in build-gpu-py/pkg, and runs bench/torch_gpu_check.py:
# seqpar.torch vs SDPA (cuDNN) under the bf16 rule, torch.compile without graph breaks, the
# Hugging Face drop-in vs attn_implementation="sdpa", and the drop-in's overhead over the C++
# API at S = 32K and 64K. Prints PASS/FAIL per check; exits 1 when any fails.
# Usage: bash scripts/torch_gpu_check.sh [build] [checks] [multi]   (default: build checks; each
# fits one 10-minute device call, so a cold machine may need `build` and `checks` as two calls;
# `multi`, on 2+ GPUs, runs each rank's shard over NCCL bootstrapped from the group's store)
# Output in $OUT (or ./torch_gpu_out): torch_gpu_check.log (everything), torch_gpu_check.jsonl.
# Needs there: PyTorch with CUDA, transformers, Python headers, and nanobind (installed, or its
# wheel in .whl/ or .carry/whl/, which scripts/pack_device_deps.sh puts there). CHECKS picks the
# checks (default sdpa,docs,compile,hf,overhead); BUILD_JOBS the compile jobs (default 16).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-torch_gpu_out}"
mkdir -p "$out"
exec > >(tee -a "$out/torch_gpu_check.log") 2>&1
stages="${*:-build checks}"
echo "== torch_gpu_check $(date -u +%FT%TZ) stages: $stages"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
source scripts/gpu_env.sh  # prefix, lib_path, inc_path; cuDNN and NCCL from PyTorch's wheels
# The module links the NCCL that PyTorch loads (its wheel's, even where the toolkit has one): a
# process holds one libnccl.so.2, whichever of torch and seqpar is imported first.
nccl_wheel="$(wheel_dir nccl)"
if [ -n "$nccl_wheel" ]; then
  export NCCL_HOME="$nccl_wheel"
  lib_path="$(link_lib nccl "$nccl_wheel");$lib_path"
  export LD_LIBRARY_PATH="$nccl_wheel/lib:$LD_LIBRARY_PATH"
fi
pkg="$PWD/build-gpu-py/pkg"
if ! python3 -m nanobind --cmake_dir > /dev/null 2>&1; then
  site="$PWD/.carry/py_site"
  wheel=$(ls .whl/nanobind-*.whl .carry/whl/nanobind-*.whl 2> /dev/null | head -n 1)
  if [ -n "$wheel" ]; then
    python3 -m pip install -q --no-deps --no-index --target "$site" "$wheel"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
status=0
for stage in $stages; do
  case "$stage" in
    build)
      start=$SECONDS
      if ! python3 -m nanobind --cmake_dir > /dev/null 2>&1; then
        echo "FAIL build: nanobind is neither installed nor carried (run scripts/pack_device_deps.sh here first)"
        status=1; continue
      fi
      timeout "${BUILD_TIMEOUT:-560}" bash -c '
        set -e
        cmake -S . -B build-gpu-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$1" \
          -DCMAKE_CUDA_ARCHITECTURES=90a -DSEQPAR_NATIVE=OFF -DSEQPAR_BUILD_PYTHON=ON -DSEQPAR_BUILD_TESTS=OFF \
          -DSEQPAR_BUILD_TOOLS=OFF -DSEQPAR_INSTALL=OFF -DSEQPAR_WITH_MPI=OFF -DPython_EXECUTABLE="$(command -v python3)" \
          -DCMAKE_LIBRARY_PATH="$2" -DCMAKE_INCLUDE_PATH="$3" | grep -E "seqpar|Error|Python" || true
        cmake --build build-gpu-py -j "${BUILD_JOBS:-16}" --target _core 2>&1 | tail -n 15' _ "$prefix" "$lib_path" "$inc_path"
      so=$(find build-gpu-py/python -maxdepth 1 -name '_core*.so' 2> /dev/null | head -n 1)
      if [ -z "$so" ]; then
        echo "FAIL build: no seqpar._core was built ($((SECONDS - start)) s; see the log above)"
        status=1; continue
      fi
      rm -rf "$pkg" && mkdir -p "$pkg/seqpar"
      cp python/seqpar/*.py "$pkg/seqpar/" && cp "$so" "$pkg/seqpar/"
      if PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
          "import seqpar._core as c; assert c.nccl_available(), 'built without NCCL'"; then
        echo "PASS build ($((SECONDS - start)) s): $pkg"
      else
        echo "FAIL build: the module does not import or lacks NCCL"; status=1
      fi ;;
    checks)
      if [ ! -d "$pkg/seqpar" ]; then
        echo "FAIL checks: no staged module in $pkg (run the build stage first)"; status=1; continue
      fi
      PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" SEQPAR_COMM_TIMEOUT_S=120 timeout "${CHECK_TIMEOUT:-560}" \
        python3 -X faulthandler -u bench/torch_gpu_check.py --checks "${CHECKS:-sdpa,docs,compile,hf,overhead}" \
        --jsonl "$out/torch_gpu_check.jsonl"
      rc=$?
      [ "$rc" = 124 ] && echo "FAIL checks: timed out after ${CHECK_TIMEOUT:-560} s"
      [ "$rc" = 0 ] || status=1 ;;
    multi)  # not in the default stages: a machine with 2+ GPUs, one process each (torchrun)
      gpus=$(nvidia-smi -L 2> /dev/null | wc -l)
      if [ "$gpus" -lt 2 ]; then
        echo "SKIP multi: it needs 2 or more GPUs; this machine has $gpus"; continue
      fi
      # PYTHONFAULTHANDLER: a crash at exit (seen once after every check passed) prints its stacks.
      PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" SEQPAR_COMM_TIMEOUT_S=120 PYTHONFAULTHANDLER=1 timeout "${CHECK_TIMEOUT:-560}" \
        torchrun --standalone --nproc_per_node="$gpus" bench/torch_gpu_check.py --checks multi \
        --jsonl "$out/torch_gpu_check_multi.jsonl"
      [ "$?" = 0 ] || status=1 ;;
    *) echo "unknown stage $stage (build, checks, multi)"; status=2 ;;
  esac
done
echo "== torch_gpu_check: $([ "$status" = 0 ] && echo PASS || echo FAIL) (log: $out/torch_gpu_check.log)"
exit $status
