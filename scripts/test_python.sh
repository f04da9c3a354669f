#!/usr/bin/env bash
# The Python package's tests: builds and installs `seqpar` with `pip install .` into a venv
# (build/python-venv), adds PyTorch and transformers (PyPI's wheels, used on the CPU) for the
# seqpar.torch / seqpar.hf tests (gloo processes), then runs pytest on python/tests. Where torch
# or transformers cannot be installed their tests skip with the reason; SEQPAR_PYTHON_TORCH=0
# skips the install. Fails when pytest fails or collects no tests. SEQPAR_JOBS caps the build's
# parallel jobs (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/python-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ".[test]"
if [ "${SEQPAR_PYTHON_TORCH:-1}" != 0 ]; then
  "$venv/bin/python" -m pip install -q torch transformers ||
    echo "[python] torch/transformers could not be installed: the seqpar.torch and seqpar.hf tests skip" >&2
fi
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[python] pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
