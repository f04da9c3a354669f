#!/usr/bin/env bash
# One call (session q, 2026-11-28), issue 36, on every GPU of the machine: the 1B preset with
# nothing recomputed (--checkpointing none: 7.6% faster than attention at 32K tokens a GPU, call
# q6) against PyTorch's peer (FSDP2 + context parallel on cuDNN, selective checkpointing,
# torch.compile, fused AdamW: bench/torch_train_peer.py) on the same text, 4 steps each, same call.
# Also ours with --lm-head-chunk 4096 (the head's fp32 dW read and written 4x less often).
# SEQ: the tokens of a step (default 32K a GPU). First ModelCuda.* (the vectorised casts of 5fc3a9a).
set -u
CALL_BUDGET_S=${CALL_BUDGET_S:-330}
source bench/device_calls/call_start.sh 16 "seqpar_cli test_model_cuda"
timeout 60 ./build-gpu/tests/test_model_cuda > "$out/model_cuda.log" 2>&1
say "model cuda rc $?: $(grep -c '^\[       OK' "$out/model_cuda.log") ok, $(grep -c '^\[  FAILED  \]' "$out/model_cuda.log") failed lines"
gpus=$(nvidia-smi -L | wc -l); seq=${SEQ:-$((32768 * gpus))}
txt=/tmp/train_text.txt; for _ in $(seq 1 48); do cat README.md docs/*.md; done > $txt
timeout 70 ./build-gpu/seqpar train --device cuda --gpus $gpus --model 1b --data "text:$txt" --seq $seq --batch 1 \
  --steps 4 --warmup 1 --checkpointing none --profile --json > "$out/ours_1b.jsonl" 2> "$out/ours_1b.err"
say "ours 1B S=$seq rc $? $(grep -m1 -i 'error' "$out/ours_1b.err")"
timeout 60 ./build-gpu/seqpar train --device cuda --gpus $gpus --model 1b --data "text:$txt" --seq $seq --batch 1 \
  --steps 4 --warmup 1 --checkpointing none --lm-head-chunk 4096 --profile --json > "$out/ours_1b_chunk4096.jsonl" 2> "$out/ours_1b_chunk4096.err"
say "ours 1B S=$seq --lm-head-chunk 4096 rc $? $(grep -m1 -i 'error' "$out/ours_1b_chunk4096.err")"
l=$(left); [ $l -gt 60 ] && { timeout $(( l - 15 )) torchrun --standalone --nproc_per_node=$gpus bench/torch_train_peer.py \
  --seqs $seq --steps 4 --data $txt > "$out/peer_1b.jsonl" 2> "$out/peer_1b.err"
  say "peer 1B S=$seq rc $? $(grep -m1 -i 'error' "$out/peer_1b.err" | head -c 300)"; }
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, os, sys
def rows(name, kind):
    path = os.path.join(sys.argv[1], name)
    if not os.path.exists(path): return []
    return [r for r in (json.loads(l) for l in open(path) if l.startswith("{")) if "tokens_per_s" in r and r.get("kind", kind) == kind]
ours, peer = rows("ours_1b.jsonl", None), rows("peer_1b.jsonl", "torch_train")
for name, rs in (("ours", ours), ("ours, LM head chunk 4096", rows("ours_1b_chunk4096.jsonl", None)), ("PyTorch", peer)):
    for r in rs:
        print(name, "step", r["step"], "tokens/s %.0f" % r["tokens_per_s"], "mfu %.4f" % r.get("mfu_989", 0),
              "peak GiB %.1f" % (r["peak_GiB"] if "peak_GiB" in r else r.get("device_peak_bytes", 0) / 2**30), "loss %.4f" % r.get("loss", 0), "lm_head %.1f" % r.get("work_ms", {}).get("lm_head", 0))
if ours and peer:
    print("ours / PyTorch, last step: %.3f" % (ours[-1]["tokens_per_s"] / peer[-1]["tokens_per_s"]))
PY
say end
PACK_GLOBS="*.jsonl *.err *.log" pack
