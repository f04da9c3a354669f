#!/usr/bin/env bash
# N GPU processes under torchrun train as N thread ranks sharing one GPU do: both follow the
# fp32 CPU trainer (the oracle's stand-in) within the bf16 rule of CONVENTIONS.md, the processes'
# weights and losses at most twice as far from it as the thread ranks' (a small model, 4 steps,
# the zigzag layout over the N ranks). Exit 77 (skipped) without N GPUs or torchrun.
# DP=G and ZERO=Z in the environment train G data-parallel groups with ZeRO stage Z (the CPU
# run takes their global batch). Usage: [DP=G] [ZERO=Z] gpu_train_torchrun.sh path/to/seqpar N
set -uo pipefail
bin="$1"
n="${2:-4}"
dp="${DP:-1}"
zero="${ZERO:-0}"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${gpus:-0}" -lt "$n" ]; then echo "needs $n GPUs; skipped"; exit 77; fi
command -v torchrun >/dev/null || { echo "needs torchrun; skipped"; exit 77; }
python3 -c "import numpy" 2>/dev/null || { echo "needs numpy; skipped"; exit 77; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SEQPAR_COMM_TIMEOUT_S=60
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cat > "$dir/config.json" <<'JSON'
{"vocab": 256, "hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512}
JSON
args=(train --config "$dir/config.json" --data recall --seq 2048 --steps 4 --warmup 2 --json)
dist=(--batch 2 --data-parallel "$dp" --zero "$zero")
"$bin" "${args[@]}" --batch $((2 * dp)) --device cpu --ranks 1 --export "$dir/cpu" > "$dir/cpu.jsonl" ||
  { echo "CPU run failed"; exit 1; }
"$bin" "${args[@]}" "${dist[@]}" --device cuda --ranks "$n" --export "$dir/threads" > "$dir/threads.jsonl" ||
  { echo "thread ranks failed"; exit 1; }
torchrun --standalone --no-python --nproc_per_node="$n" "$bin" "${args[@]}" "${dist[@]}" --device cuda --export "$dir/procs" \
  > "$dir/procs.jsonl" 2> "$dir/procs.err" || { echo "torchrun failed:"; grep -v "^\s*$" "$dir/procs.err" | head -n 12; exit 1; }
python3 - "$dir" <<'PY'
import json, struct, sys
import numpy as np
d = sys.argv[1]

def weights(run):  # safetensors: an 8-byte header length, the JSON header, the raw tensors
    raw = open(f"{d}/{run}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).astype(np.float64)
    return out

def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{d}/{run}.jsonl") if l.startswith("{")]

cpu = weights("cpu")
def worst(run):  # the worst tensor's relative Frobenius distance from the CPU run
    w = weights(run)
    return max(np.linalg.norm(w[k] - cpu[k]) / max(np.linalg.norm(cpu[k]), 1e-30) for k in cpu)
def loss_gap(run):
    return max(abs(a - b) for a, b in zip(losses(run), losses("cpu")))
threads, procs = worst("threads"), worst("procs")
lt, lp = loss_gap("threads"), loss_gap("procs")
print(f"weights from the CPU run: threads {threads:.3e}, processes {procs:.3e}; losses: {lt:.3e}, {lp:.3e}")
assert len(losses("procs")) == len(losses("cpu")) == 4, "a run stopped early"
assert threads > 0, "bf16 training equal to fp32's: the comparison says nothing"
assert procs <= 2 * threads, "the processes' weights are further from the CPU run than the rule allows"
assert lp <= 2 * lt + 1e-6, "the processes' losses are further from the CPU run than the rule allows"
print("PASS")
PY
