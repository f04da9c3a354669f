#!/usr/bin/env bash
# One call on 4 GPUs (session k, 2026-11-28): issue 39's lengths with the tiles and offloaded
# checkpoints, and the pinning A/B behind them.
#  1. build; bench_gpu_pin on all four GPUs at once (a node's ranks pinning side by side), 16 GiB a
#     process in 1 GiB slots, cudaHostAlloc then pin_host_bytes (mmap + cudaHostRegister)
#  2. tnl-1b at 2M tokens on 4 GPUs (ZeRO-3, LASP, --tile-tokens -1, --offload-checkpoints)
#  3. tnl-1b at 1M on 2 GPUs, beside GpuTrain.TiledMlpFollowsTheCpuRunAsUntiledDoes on a third
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-k" && ln -sfn "$root/build-gpu-k" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-575}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err *.log); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
grep -H . /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag >> "$out/summary.txt" 2>&1
BUILD_JOBS=64 BUILD_TARGETS="seqpar_cli test_gpu_train bench_gpu_pin" timeout 240 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
for g in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$g timeout 90 ./build-gpu/bench_gpu_pin --gib 16 > "$out/pin_$g.jsonl" 2> "$out/pin_$g.err" &
done
wait
say "pin: $(cat "$out"/pin_*.jsonl | python3 -c 'import sys,json; print([(d["way"],d["mapped"],round(d["pin_gbps"],2),round(d["d2h_gbps"],1),round(d["h2d_gbps"],1)) for d in map(json.loads,sys.stdin)])')"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train() {  # devices gpus seq tag cap
  CUDA_VISIBLE_DEVICES=$1 timeout $5 ./build-gpu/seqpar train --device cuda --gpus $2 --model tnl-1b --data "text:$txt" \
    --seq $3 --batch 1 --steps 3 --warmup 1 --checkpointing attention --offload-checkpoints --zero 3 --linear-sp lasp \
    --tile-tokens -1 --json > "$out/$4.jsonl" 2> "$out/$4.err"
  local rc=$?; say "$4 rc $rc $(grep -h '"step"' "$out/$4.jsonl" | cut -c1-250 | tr '\n' ' ') $(grep -m1 -i error "$out/$4.err")"
}
l=$(left); train 0,1,2,3 4 2097152 tnl1b_4gpu_tiles_2097152 $(( l - 150 > 260 ? 260 : l - 150 ))
l=$(left)
( CUDA_VISIBLE_DEVICES=2 OMP_NUM_THREADS=8 timeout $(( l - 10 )) ./build-gpu/tests/test_gpu_train \
    --gtest_filter='GpuTrain.TiledMlpFollowsTheCpuRunAsUntiledDoes' > "$out/gpu_train_tiled.log" 2>&1 ) &
train 0,1 2 1048576 tnl1b_2gpu_tiles_1048576 $(( l - 10 ))
wait
say "tiled test: $(grep -E '^\[  (PASSED|FAILED)|Failure|Expected|actual' "$out/gpu_train_tiled.log" | head -8 | tr '\n' ' ')"
say end
pack
