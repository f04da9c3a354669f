#!/usr/bin/env bash
# The two-GPU runs (nvidia-h200-x2 through the device tool, .carry carried): each comparison runs
# side by side with its peer in the same stage. Stages, in the order given:
#   build   bench_gpu_ring, seqpar_cli and test_gpu_schedules into build-gpu (scripts/gpu_check.sh)
#   attn    causal, bf16, H = 32, D = 128: ring, burst, auto, ulysses (zigzag) and distflash
#           (contiguous, its layout) at 16K-256K, and 512K once each, against PyTorch context
#           parallel (cuDNN) at 16K-512K
#   gqa     GQA 4:1 and 8:1 (K/V heads 8 and 4) at 64K and 256K, the same algorithms against
#           PyTorch (K/V repeated to 32 heads before SDPA); then the sliding window (8K) and 64
#           documents at 64K, 256K and 512K (ours only: PyTorch's context parallel SDPA takes no
#           such mask)
#   regress run 1: the two-rank path before the executor redesign (7e6f94d, or BEFORE=<commit>,
#           packed into .carry/oldpath by pack_device_deps.sh and built here; REGRESS_OLD_ALGOS its
#           algorithms, default ring,burst,auto) against ours and PyTorch context
#           parallel, same call, causal MHA at REGRESS_SEQS (default 16K, 64K, 128K; REGRESS_REPEAT
#           rounds) and REGRESS_BIG (auto alone); each side's ring, Burst and auto (ours:
#           ring-return and burst-return, the same exchanges)
#   tests   the GPU schedule tests (ctest -R GpuSchedule|GpuExecutor) and the kill-a-rank test;
#           the Python module builds beside them (scripts/torch_gpu_check.sh build)
#   lasp    LASP on GPUs (bench_gpu_lasp): the state chain against the all-gather on every GPU at
#           1M-16M tokens until one does not fit, and the chain on one GPU the same way (the
#           longest on one against the longest on all)
#   train   the GPU trainer's tests (test_gpu_train: ranks on two GPUs against one rank), then the
#           1B-shaped model (seqpar train --gpus N, attention checkpointing) against
#           bench/torch_train_peer.py (FSDP2 + context parallel + selective AC + torch.compile; without
#           compile if that fails) at TRAIN_SEQS (default 65536), 4 steps each
#   python  seqpar.torch under torchrun on both GPUs against SDPA (torch_gpu_check.sh multi), and
#           examples/hf_finetune.py at HF_SEQ tokens (default 131072) on both GPUs against the
#           same training in one process with SDPA, bf16 and fp32 (bench/compare_loss_curves.py)
# Everything goes to $OUT (or ./two_gpu_out): log.txt, one JSON-lines file and one table per
# bench stage, and scratch.tgz with the sub-scripts' own logs. Each step has its own timeout,
# cut to what is left of DEADLINE seconds (default 570) from the start, so that a call of 10
# minutes returns its results; a step with under 20 s left is skipped.
# Usage: bash scripts/two_gpu_runs.sh build attn tests      (then: bash scripts/two_gpu_runs.sh gqa python)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-two_gpu_out}"
mkdir -p "$out"
scratch="$PWD/two_gpu_scratch"
mkdir -p "$scratch"
exec > >(tee -a "$out/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SEQPAR_COMM_TIMEOUT_S=120
start=$SECONDS
deadline="${DEADLINE:-570}"
stamp() { echo "== [$((SECONDS - start)) s] $*"; }
# limit N: N seconds, or what is left before the deadline if less; fails (skip the step) under 20 s.
limit() {
  local left=$((deadline - (SECONDS - start)))
  [ "$left" -lt 20 ] && { echo "skipped: ${left} s left before the deadline" >&2; return 1; }
  echo $(( $1 < left ? $1 : left ))
}
# within N CMD...: CMD under timeout limit(N); a skipped step counts as failed.
within() { local t; t=$(limit "$1") || return 124; timeout "$t" "${@:2}"; }
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv
status=0
ring=./build-gpu/bench_gpu_ring
peer() { within "$1" torchrun --standalone --nproc_per_node="$gpus" bench/torch_cp_peer.py "${@:2}"; }
py_build_pid=""

# The build (ninja: only what changed); the bench stages call it first when a binary is missing,
# as on a fresh machine whose last call built elsewhere.
build() {
  OUT="$scratch" BUILD_JOBS="${BUILD_JOBS:-32}" BUILD_TARGETS="${BUILD_TARGETS:-bench_gpu_ring bench_gpu_lasp seqpar_cli test_gpu_schedules test_gpu_train test_gpu_lasp}" \
    within 420 bash scripts/gpu_check.sh build > "$scratch/build_stage.log" 2>&1
  local rc=$?
  tail -n 5 "$scratch/build_stage.log"
  [ "$rc" = 0 ] || { echo "build failed ($rc)"; tail -n 40 "$scratch/build_stage.log"; return 1; }
}
built() {
  [ -x "$ring" ] && [ -x ./build-gpu/bench_gpu_lasp ] && [ -x ./build-gpu/seqpar ] && [ -x ./build-gpu/tests/test_gpu_train ] &&
    [ -x ./build-gpu/tests/test_gpu_schedules ] && [ -x ./build-gpu/tests/test_gpu_lasp ]
}

stages=("$@")
[ ${#stages[@]} = 0 ] && stages=(build attn tests)
for stage in "${stages[@]}"; do
  stamp "stage $stage"
  if [[ "$stage" =~ ^(attn|gqa|regress|tests|train|lasp)$ ]] && ! built; then
    stamp "no build here yet: building first"
    build || { status=1; break; }
  fi
  case "$stage" in
    build)
      build || { status=1; break; } ;;
    attn)
      f="$out/attn.jsonl"
      within 150 $ring --seqs 16384,65536,131072,262144,524288 --algos ring,burst,auto,ulysses \
        --big-from 524288 --big-algos auto,ulysses | tee -a "$f" || status=1
      within 60 $ring --seqs 16384,65536,131072,262144,524288 --algos distflash --layout contiguous \
        --big-from 524288 --big-algos distflash --single-max 0 | tee -a "$f" || status=1
      peer 150 --seqs 16384,65536,131072,262144,524288 --max-seconds 130 | tee -a "$f" || status=1
      python3 bench/compare_multi_gpu.py "$f" "$f" | tee "$out/attn.md" ;;
    gqa)
      f="$out/gqa.jsonl"
      for kv in 8 4; do
        within 60 $ring --seqs 65536,262144 --kv-heads $kv --algos ring,auto,ulysses --single-max 0 | tee -a "$f" || status=1
        within 30 $ring --seqs 65536,262144 --kv-heads $kv --algos distflash --layout contiguous --single-max 0 \
          | tee -a "$f" || status=1
        peer 60 --seqs 65536,262144 --kv-heads $kv | tee -a "$f" || status=1
      done
      for mask in window:8192,0 docs:64; do
        within 40 $ring --seqs 65536,262144,524288 --mask $mask --algos ring,auto,ulysses --single-max 0 \
          --big-from 1048576 | tee -a "$f" || status=1
        within 30 $ring --seqs 65536,262144,524288 --mask $mask --algos distflash --layout contiguous --single-max 0 \
          --big-from 1048576 | tee -a "$f" || status=1
      done
      python3 bench/compare_multi_gpu.py "$f" "$f" | tee "$out/gqa.md" ;;
    regress)
      old=/tmp/seqpar_before_redesign
      if [ ! -x "$old/build-gpu/bench_gpu_ring" ]; then
        rm -rf "$old" && cp -r .carry/oldpath "$old" && ln -s "$PWD/.carry" "$old/.carry"
        (cd "$old" && OUT="$scratch/old" BUILD_JOBS=16 BUILD_TARGETS=bench_gpu_ring within 300 bash scripts/gpu_check.sh build \
          > "$scratch/old_build.log" 2>&1) || { echo "the old path's build failed"; tail -n 30 "$scratch/old_build.log"; status=1; continue; }
      fi
      # REGRESS_REPEAT rounds of old then ours at REGRESS_SEQS (the short lengths vary by a few % from
      # run to run), then auto alone (and our ring-return) at REGRESS_BIG, then the peer at all.
      seqs="${REGRESS_SEQS:-16384,65536,131072}"
      for _ in $(seq "${REGRESS_REPEAT:-1}"); do
        within 150 "$old/build-gpu/bench_gpu_ring" --seqs "$seqs" --algos "${REGRESS_OLD_ALGOS:-ring,burst,auto}" --single-max 0 \
          | tee -a "$out/regress_old.jsonl" || status=1
        within 150 $ring --seqs "$seqs" --algos ring-return,burst-return,auto --single-max 0 \
          | tee -a "$out/regress_new.jsonl" || status=1
      done
      big="${REGRESS_BIG:-}"
      if [ -n "$big" ]; then
        within 150 "$old/build-gpu/bench_gpu_ring" --seqs "$big" --algos auto --single-max 0 | tee -a "$out/regress_old.jsonl" || status=1
        within 150 $ring --seqs "$big" --algos ring-return,auto --single-max 0 | tee -a "$out/regress_new.jsonl" || status=1
      fi
      peer 200 --seqs "$seqs${big:+,$big}" | tee -a "$out/regress_peer.jsonl" || status=1
      python3 bench/compare_multi_gpu.py "$out/regress_old.jsonl" "$out/regress_peer.jsonl" | tee "$out/regress_old.md"
      python3 bench/compare_multi_gpu.py "$out/regress_new.jsonl" "$out/regress_peer.jsonl" | tee "$out/regress_new.md" ;;
    tests)
      # The module compiles on the CPU cores while the tests use the GPUs.
      OUT="$scratch" BUILD_JOBS=16 within 400 bash scripts/torch_gpu_check.sh build > "$scratch/py_build.log" 2>&1 &
      py_build_pid=$!
      (cd build-gpu && OMP_NUM_THREADS=8 within 240 ctest --output-on-failure -j 4 \
        -R "GpuSchedule|GpuExecutor|GpuLasp|gpu_kill_rank" 2>&1) > "$out/tests.log"
      rc=$?
      grep -E "tests passed|Failed|\*\*\*|Total Test time|rank 0 exited" "$out/tests.log" | tail -n 30
      [ "$rc" = 0 ] || status=1 ;;
    lasp)
      f="$out/lasp.jsonl"
      lasp_seqs=1048576,2097152,4194304,8388608,16777216
      within 240 ./build-gpu/bench_gpu_lasp --seqs "$lasp_seqs" --algos lasp,lasp2 | tee -a "$f" || status=1
      within 150 ./build-gpu/bench_gpu_lasp --gpus 1 --seqs "$lasp_seqs" --algos lasp | tee -a "$f" || status=1 ;;
    train)
      (cd build-gpu && within 150 ./tests/test_gpu_train --gtest_brief=1 2>&1) | tee "$out/train_tests.log" | tail -n 15
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      f="$out/train.jsonl"
      # The same bytes for both as tokens: the repository's text, repeated past the longest S.
      txt="$scratch/train_text.txt"
      for _ in 1 2 3 4 5 6 7 8; do cat README.md docs/RESULTS.md; done > "$txt"
      for S in ${TRAIN_SEQS:-65536}; do
        within 150 ./build-gpu/seqpar train --device cuda --gpus "$gpus" --model 1b --data "text:$txt" --seq "$S" \
          --batch 1 --steps 4 --checkpointing attention --json | tee -a "$f" || status=1
        within 240 torchrun --standalone --nproc_per_node="$gpus" bench/torch_train_peer.py --seqs "$S" --steps 4 \
          --data "$txt" | tee -a "$f" || within 200 torchrun --standalone --nproc_per_node="$gpus" bench/torch_train_peer.py \
          --seqs "$S" --steps 4 --data "$txt" --no-compile | tee -a "$f" || status=1
      done ;;
    python)
      [ -n "$py_build_pid" ] && wait "$py_build_pid"
      OUT="$scratch" within 400 bash scripts/torch_gpu_check.sh build multi > "$scratch/python.log" 2>&1 || status=1
      grep -E "^(PASS|FAIL)|== torch_gpu_check" "$scratch/python.log"
      cp "$scratch/torch_gpu_check_multi.jsonl" "$out/" 2> /dev/null
      export PYTHONPATH="$PWD/build-gpu-py/pkg${PYTHONPATH:+:$PYTHONPATH}"
      source scripts/gpu_env.sh
      seq="${HF_SEQ:-131072}"
      steps="${HF_STEPS:-5}"
      common=(examples/hf_finetune.py --device cuda --seq "$seq" --steps "$steps" --kv-heads 8 --lr 1e-3)
      hf="$scratch/hf"
      mkdir -p "$hf"
      within 150 torchrun --standalone --nproc_per_node="$gpus" "${common[@]}" --jsonl "$hf/ours.jsonl" || status=1
      # The references, one process each, side by side on the two GPUs.
      CUDA_VISIBLE_DEVICES=0 within 200 python3 "${common[@]}" --attn sdpa --jsonl "$hf/plain.jsonl" &
      ref_bf16=$!
      CUDA_VISIBLE_DEVICES=1 within 200 python3 "${common[@]}" --attn sdpa --dtype fp32 --jsonl "$hf/oracle.jsonl"
      wait $ref_bf16
      cat "$hf"/*.jsonl > "$out/hf.jsonl"
      python3 bench/compare_loss_curves.py "$hf/ours.jsonl" "$hf/plain.jsonl" "$hf/oracle.jsonl" | tee "$out/hf.md" \
        || status=1 ;;
    *) echo "unknown stage $stage (build, attn, gqa, regress, tests, lasp, train, python)"; status=2 ;;
  esac
done
[ -n "$py_build_pid" ] && { stamp "waiting for the Python module's build"; wait "$py_build_pid"; \
  grep -E "PASS build|FAIL build" "$scratch/py_build.log"; }
stamp "done, status $status"
tar czf "$out/scratch.tgz" -C "$scratch" . 2> /dev/null
exit $status
