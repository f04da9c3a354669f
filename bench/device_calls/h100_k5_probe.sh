#!/usr/bin/env bash
# One call on one H100 (session k, 2026-11-28): seqpar probe's CUDA path, first run (one GPU: attention
# rows, launch and wait, GEMM, copy, memory; no link with one rank), and seqpar plan on its file.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-k" && ln -sfn "$root/build-gpu-k" build-gpu
BUILD_JOBS=16 BUILD_TARGETS="seqpar_cli" timeout 150 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
echo "build rc $?"; source scripts/gpu_env.sh
timeout 60 ./build-gpu/seqpar probe --device cuda --out "$out/probe_h100.json" 2> "$out/probe.log"; echo "probe rc $?"
tail -25 "$out/probe.log"
./build-gpu/seqpar plan --cluster "$out/probe_h100.json" --heads 32 --kv-heads 8 --seq 262144 2>&1 | tail -4
