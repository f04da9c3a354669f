# call_start.sh: the start a device-call script shares (sourced from the repository root of the
# machine's copy, as `source bench/device_calls/call_start.sh JOBS "TARGETS"`): the device
# environment (no NVLink multicast), into the `git archive` snapshot in .carry/snap with the
# build in ../build-gpu-l (reused on a warm machine), the helpers left / say / pack / counts / suite / shards / matrix / peer / liger_env / train_text / train1b, the GPUs
# named in $OUT/summary.txt, the build of TARGETS with JOBS jobs, and scripts/gpu_env.sh; a failed
# build prints its first errors, packs the logs and exits. BUDGET_S (seconds the script may take)
# sets `budget`, CALL_BUDGET_S its default; PACK_GLOBS the files pack() tars into $OUT/all.tgz.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=120
out=$OUT; root=$PWD
cd .carry/snap && ln -sfn "$root/.carry" .carry && mkdir -p "$root/build-gpu-l" && ln -sfn "$root/build-gpu-l" build-gpu
t0=$SECONDS; budget=${BUDGET_S:-${CALL_BUDGET_S:-560}}
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/summary.txt"; }
pack() { (cd "$out" && tar czf all.tgz ${PACK_GLOBS:-*.jsonl *.err *.log} 2>/dev/null; rm -f ${PACK_GLOBS:-*.jsonl *.err *.log}); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/summary.txt" 2>&1
BUILD_JOBS=$1 BUILD_TARGETS="$2" timeout 300 bash scripts/gpu_check.sh build > "$out/build.log" 2>&1
rc=$?; say "build rc $rc"
source scripts/gpu_env.sh
[ $rc -ne 0 ] && { cmake --build build-gpu -j "$1" 2>&1 | grep -v 'ptxas info\|Wpsabi\|inline typename\|\^~' | grep -B3 -A12 -m3 ' error\|Error ' | head -80; pack; exit 1; }
# matrix KV MASK LAYOUT SEQS TAG ALGOS [FLAGS]: bench_gpu_ring (H = 32, D = 128) into
# $out/matrix_TAG.jsonl, capped at CAP seconds (default 60) and the call's time left. (Scripts
# before session q define their own.)
matrix() {
  local l=$(left); [ $l -lt 35 ] && { say "out of time before $5"; return 9; }
  timeout $(( l - 20 < ${CAP:-60} ? l - 20 : ${CAP:-60} )) ./build-gpu/bench_gpu_ring --seqs $4 --mask $2 --layout $3 \
    --algos $6 --heads 32 --kv-heads $1 --head-dim 128 ${7:---single-max 0 --rounds 1} >> "$out/matrix_$5.jsonl" 2>> "$out/matrix_$5.err"
  say "$5 rc $? $(grep -c seqpar_ring "$out/matrix_$5.jsonl") lines"
}
# peer TAG SEQS KV: PyTorch context parallel on cuDNN (bench/torch_cp_peer.py), causal, on every
# GPU, into $out/peer_cp_TAG.jsonl, capped at 90 s and the time left.
peer() {
  local l=$(left); [ $l -lt 50 ] && { say "out of time before peer $1"; return 9; }
  local cap=$(( l - 20 < 90 ? l - 20 : 90 ))
  timeout $cap torchrun --standalone --nproc_per_node="$(nvidia-smi -L | wc -l)" bench/torch_cp_peer.py --seqs $2 \
    --kv-heads $3 --max-seconds $(( cap - 25 )) >> "$out/peer_cp_$1.jsonl" 2>> "$out/peer_cp_$1.err"
  say "peer $1 rc $? $(grep -c fwdbwd_ms "$out/peer_cp_$1.jsonl") lines"
}
# counts LOGS...: a gtest log's passed, failed and skipped lines. suite NAME CAP [ARGS]: the test
# binary build-gpu/tests/NAME, capped at CAP seconds and the call's time left, into $out/NAME.log,
# its counts and first failures into the summary. shards NAME N CAP: N gtest shards at once.
counts() { echo "$(cat "$@" | grep -c '^\[       OK') ok, $(cat "$@" | grep -c '^\[  FAILED  \]') failed lines, $(cat "$@" | grep -c '^\[  SKIPPED') skipped"; }
suite() {
  local name=$1 cap=$2; shift 2
  local l=$(left); [ $l -lt 20 ] && { say "out of time before $name"; return 9; }
  OMP_NUM_THREADS=16 timeout $(( l - 10 < cap ? l - 10 : cap )) ./build-gpu/tests/$name "$@" > "$out/$name.log" 2>&1
  say "$name rc $?: $(counts "$out/$name.log")"
  grep -h '^\[  FAILED  \]\|Failure\|Which is\|max error' "$out/$name.log" | head -12 >> "$out/summary.txt"
}
shards() {
  local name=$1 n=$2 cap=$3 i
  for i in $(seq 0 $((n - 1))); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=$((16 / n)) timeout $cap ./build-gpu/tests/$name \
      > "$out/${name}_$i.log" 2>&1 &
  done
  wait
  say "$name ($n shards): $(counts "$out/${name}"_*.log)"
  grep -h '^\[  FAILED  \]\|Failure\|Which is\|max error' "$out/${name}"_*.log | head -12 >> "$out/summary.txt"
}
# liger_env: Liger-Kernel from its carried wheel (.carry/whl; packaging only where the machine
# lacks it) into /tmp/liger_site, on PYTHONPATH.
liger_env() {
  local site=/tmp/liger_site wheels
  wheels=$(ls .carry/whl/liger_kernel-*.whl)
  python3 -c "import packaging" 2>/dev/null || wheels="$wheels $(ls .carry/whl/packaging-*.whl)"
  python3 -m pip install -q --no-deps --no-index --target "$site" $wheels > "$out/pip.log" 2>&1
  say "pip rc $?"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}
# train_text: the training text both sides read ($txt: the README and docs 48 times), made once.
txt=/tmp/train_text.txt
train_text() { [ -s "$txt" ] || for _ in $(seq 1 48); do cat README.md docs/*.md; done > "$txt"; }
# train1b TAG SEQ STEPS [FLAGS...]: `seqpar train --model 1b` on one GPU, profiled by kind, into
# $out/train_1b_TAG.jsonl, capped at 90 s and the call's time left; its steps by KINDS (default
# below) into the summary.
train1b() {
  local tag=$1 seq=$2 steps=$3; shift 3
  local l=$(left); [ $l -lt 40 ] && { say "out of time before 1B $tag"; return 9; }
  train_text
  timeout $(( l - 10 < 90 ? l - 10 : 90 )) ./build-gpu/seqpar train --device cuda --gpus 1 --model 1b --data "text:$txt" \
    --seq $seq --batch 1 --steps $steps --warmup 1 --profile --json "$@" > "$out/train_1b_$tag.jsonl" 2> "$out/train_1b_$tag.err"
  say "1B $tag rc $? $(grep -m1 -i 'error' "$out/train_1b_$tag.err")"
  python3 bench/device_calls/train_summary.py "$out/train_1b_$tag.jsonl" "$tag" \
    ${KINDS:-attention products swiglu rope norms casts lm_head step} | tee -a "$out/summary.txt"
}
