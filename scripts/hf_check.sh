#!/usr/bin/env bash
# On a machine with PyTorch and transformers (the GPU machine): builds seqpar's CPU tool, records
# `seqpar train` runs with --dump (the tiny model on text bytes, 50 AdamW steps: S = 4K on one
# rank and S = 16K on four sequence ranks), and replays each with Hugging Face's LlamaForCausalLM
# (bench/hf_llama_check.py): step-0 loss and gradients, and both loss curves. Output in $OUT
# (or ./hf_out): one log, the JSON lines, the SVG plots.
# `bash scripts/hf_check.sh gpu` instead records one step of the GPU trainer (build-gpu/seqpar,
# from scripts/gpu_check.sh; bench/hf_check_model.json: head dim 64, S = 4K) and holds it to the
# bf16 rule against transformers (fp32 reference, plain bf16 for the rule's bound).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-hf_out}"
mkdir -p "$out"
prefix="$PWD/.carry/deps/usr"
export LD_LIBRARY_PATH="$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
if [ "${1:-}" = gpu ]; then
  dir=build-gpu/dump_gpu_S4096
  ./build-gpu/seqpar train --device cuda --ranks 1 --config bench/hf_check_model.json --data text:README.md \
    --seq 4096 --batch 2 --steps 1 --dump "$dir" --json > "$out/ours_gpu_S4096.jsonl" || exit 1
  python3 bench/hf_llama_check.py "$dir" --bf16-rule --label "GPU, S = 4096" 2>&1 | tee "$out/hf_bf16_rule.log"
  exit "${PIPESTATUS[0]}"
fi
cmake -S . -B build-hf -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DSEQPAR_WITH_CUDA=OFF \
  -DSEQPAR_NATIVE=OFF -DSEQPAR_BUILD_TESTS=OFF 2>&1 | grep -E "seqpar|Error" | tee "$out/hf_cmake.log"
cmake --build build-hf -j "${BUILD_JOBS:-16}" --target seqpar_cli 2>&1 | tail -n 3
common=(train --data text:README.md --vocab 256 --batch 2 --steps 50 --warmup 5 --lr 2e-3 --layout zigzag)
for run in "4096 1" "16384 4"; do
  set -- $run
  dir="build-hf/dump_S$1_P$2"
  ./build-hf/seqpar "${common[@]}" --seq "$1" --ranks "$2" --dump "$dir" --json > "$out/ours_S$1_P$2.jsonl" || exit 1
  python3 bench/hf_llama_check.py "$dir" --plot "$out/hf_curves_S$1_P$2.svg" --label "S = $1 on $2 rank(s)" \
    2>&1 | tee -a "$out/hf_check.log"
done
grep '"kind": "hf_llama_check"' "$out/hf_check.log" > "$out/hf_check.jsonl"
