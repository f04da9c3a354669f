#!/usr/bin/env bash
# Installs the OS packages seqpar builds with (Debian/Ubuntu): compiler, CMake, Open MPI,
# GoogleTest, CLI11, nlohmann-json, OpenBLAS (the training engine's CPU matrix products; OpenMP
# comes with GCC), and Python's headers and venv for the Python package (pip install . builds
# it; its build tools come from PyPI). Skips apt when everything is already there.
set -euo pipefail

packages=(build-essential cmake libopenmpi-dev openmpi-bin libgtest-dev libcli11-dev
          nlohmann-json3-dev libopenblas-dev python3-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi

# With a CUDA toolkit present, the GPU backends build too; they need the cuDNN frontend
# headers (header-only, from PyPI).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  bash "$(dirname "$0")/fetch_cudnn_frontend.sh"
fi
