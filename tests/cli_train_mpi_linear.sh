#!/usr/bin/env bash
# tnl-tiny (every layer linear attention, LASP) trained for 50 steps by `seqpar train` on one
# rank, on 4 thread ranks, on 4 mpirun processes, and on 4 mpirun processes as 2 data-parallel
# groups of 2 sequence ranks with ZeRO 3: every run's per-step losses within 1e-5 (relative) of
# the one-rank run's (issue 39). Usage: cli_train_mpi_linear.sh SEQPAR MPIEXEC
set -euo pipefail
seqpar=$1 mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run=(train --model tnl-tiny --steps 50 --seq 64 --checkpointing full --threads-per-rank 1 --json)
"$seqpar" "${run[@]}" --batch 4 --ranks 1 > "$dir/one.jsonl"
"$seqpar" "${run[@]}" --batch 4 --ranks 4 > "$dir/threads.jsonl"
"$mpiexec" -np 4 --oversubscribe "$seqpar" "${run[@]}" --batch 4 > "$dir/mpi.jsonl"
"$mpiexec" -np 4 --oversubscribe "$seqpar" "${run[@]}" --batch 2 --data-parallel 2 --zero 3 > "$dir/mpi_dp_zero3.jsonl"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}.jsonl") if l.startswith("{")]
one = losses("one")
assert len(one) == 50, f"one rank ran {len(one)} steps"
assert one[-1] < one[0] - 0.5, f"tnl-tiny did not learn: {one[0]} -> {one[-1]}"
bad = 0
for name in ("threads", "mpi", "mpi_dp_zero3"):
    other = losses(name)
    worst = max(abs(a / b - 1) for a, b in zip(other, one)) if len(other) == len(one) else float("inf")
    print(f"{name}: {len(other)} steps, worst relative loss difference {worst:.3g}")
    bad += not worst <= 1e-5
sys.exit(1 if bad else 0)
PY
