#!/usr/bin/env bash
# The Python package's tests: builds and installs `seqpar` with `pip install .` into a venv
# (build/python-venv), then runs pytest on python/tests. Fails when pytest fails or collects
# no tests. SEQPAR_JOBS caps the build's parallel jobs (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/python-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${SEQPAR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ".[test]"
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[python] pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
