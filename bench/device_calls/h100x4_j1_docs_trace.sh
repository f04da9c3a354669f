#!/usr/bin/env bash
# One call on 4 GPUs (session j, 2026-11-28, the first): where the documents layout's time goes.
#  1. build (bench_gpu_ring, seqpar, test_gpu_train)
#  2. lognormal documents (docs-lognormal:8192), documents layout, GQA 32:8, 256K-1M: auto (the
#     planner now prices the documents layout), ring-return, ulysses, ulysses-ring, interleaved rounds
#  3. the same at 256K with one head group, and --trace of ulysses and ring-return (step milestones)
#  4. seqpar train on the documents layout on 4 GPUs (the kept auto choice), 1b preset, against causal
#  5. tnl-1b with offloaded checkpoints: 1M and 1.5M on 4 GPUs, 256K on 1
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-i" && ln -sfn "$root/build-gpu-i" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-560}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err *.log); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=64 BUILD_TARGETS="bench_gpu_ring seqpar_cli test_gpu_train" timeout 280 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j 64 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
common="--heads 32 --kv-heads 8 --head-dim 128 --single-max 0"
timeout 150 ./build-gpu/bench_gpu_ring --seqs 262144,524288,1048576 --mask docs-lognormal:8192 --layout documents \
  --algos auto,ring-return,ulysses,ulysses-ring --rounds 3 $common >> "$out/docs_rounds.jsonl" 2>> "$out/err.log"
say "docs rounds rc $? $(grep -c seqpar_ring "$out/docs_rounds.jsonl") lines"
timeout 60 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents \
  --algos ulysses,ring-return --head-groups 1 --rounds 2 $common >> "$out/docs_g1.jsonl" 2>> "$out/err.log"
say "docs one group rc $?"
timeout 60 ./build-gpu/bench_gpu_ring --seqs 262144 --mask docs-lognormal:8192 --layout documents \
  --algos ulysses,ring-return --trace $common >> "$out/docs_trace.jsonl" 2>> "$out/err.log"
say "docs trace rc $?"
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
train() {  # gpus seq tag [extra...]
  local g=$1 S=$2 tag=$3; shift 3
  local l=$(left); [ $l -lt 45 ] && { say "out of time before $tag"; return 9; }
  timeout $(( l - 25 < ${CAP:-120} ? l - 25 : ${CAP:-120} )) ./build-gpu/seqpar train --device cuda --gpus $g --data "text:$txt" --seq $S --batch 1 \
    --steps ${STEPS:-3} --warmup 1 --checkpointing attention --json "$@" > "$out/$tag.jsonl" 2> "$out/$tag.err"
  local rc=$?; say "$tag rc $rc $(tail -n 1 "$out/$tag.jsonl" | head -c 330) $(grep -m1 -i 'error' "$out/$tag.err")"
  return $rc
}
STEPS=4 train 4 131072 llama1b_docs_131072 --model 1b --zero 3 --pack 10 --layout documents
STEPS=4 train 4 131072 llama1b_causal_131072 --model 1b --zero 3
for S in 1048576 1572864; do CAP=150 train 4 $S tnl1b_4gpu_lasp_offload_$S --model tnl-1b --zero 3 --linear-sp lasp --offload-checkpoints || break; done
train 1 262144 tnl1b_1gpu_offload_262144 --model tnl-1b --offload-checkpoints
say end
pack
