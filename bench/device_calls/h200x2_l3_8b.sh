#!/usr/bin/env bash
# One call on 2 H200 (session l, 2026-11-28): the 8B preset at 64K tokens on 2 GPUs (issue 36's
# second bullet, on the GPUs lent: no 4-GPU kind that day), ours with ZeRO-3 and --profile against
# PyTorch's FSDP2 + context-parallel peer on the same text, same call. Needs H200s: the 8B model's
# fp32 weights, gradients and AdamW moments under ZeRO-3 over 2 GPUs are 72 GB a GPU before any
# activation.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=180
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-l" && ln -sfn "$root/build-gpu-l" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-480}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz *.jsonl *.err *.log 2>/dev/null; rm -f *.jsonl *.err *.log); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=32 BUILD_TARGETS="seqpar_cli" timeout 240 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { pack; exit 1; }
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
l=$(left); timeout $(( l - 150 < 170 ? l - 150 : 170 )) ./build-gpu/seqpar train --device cuda --gpus 2 --model 8b --zero 3 \
  --data "text:$txt" --seq 65536 --batch 1 --steps 3 --warmup 1 --checkpointing attention --profile --json \
  > "$out/ours_8b_64k.jsonl" 2> "$out/ours_8b_64k.err"
say "ours rc $? $(tail -n 1 "$out/ours_8b_64k.jsonl" | head -c 900) $(grep -m1 -i 'error' "$out/ours_8b_64k.err")"
l=$(left); timeout $(( l - 10 )) torchrun --standalone --nproc_per_node=2 bench/torch_train_peer.py --model 8b --seqs 65536 \
  --steps 3 --data $txt > "$out/peer_8b_64k.jsonl" 2> "$out/peer_8b_64k.err"
say "peer rc $? $(grep '^{' "$out/peer_8b_64k.jsonl" | tail -n 1 | head -c 400) $(grep -m1 -i 'error' "$out/peer_8b_64k.err")"
say end
pack
