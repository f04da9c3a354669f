#!/usr/bin/env bash
# Puts the cuDNN frontend headers (header-only C++ API over cuDNN 9) into
# .carry/cudnn_frontend/include, from the nvidia-cudnn-frontend wheel on PyPI. CMake looks
# there; the folder is ignored by git and travels to the GPU machine with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CUDNN_FRONTEND_VERSION:-1.32.0}"
dest=.carry/cudnn_frontend
if [ -f "$dest/include/cudnn_frontend.h" ]; then
  echo "[setup] cuDNN frontend headers present"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --only-binary=:all: -q -d "$tmp" "nvidia-cudnn-frontend==$version"
mkdir -p "$dest"
python3 - "$tmp" "$dest" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("include/"):
            z.extract(name, sys.argv[2])
PY
echo "[setup] cuDNN frontend $version headers in $dest/include"
