#!/usr/bin/env python3
"""Fits a cluster's shard-step factors (cluster.hpp: shard_step_factor) from runs measured on it.

`seqpar probe` times single attention calls on an idle GPU. A ring-family schedule's compute steps
(shard pairs: ring, Burst, their return forms, DistFlashAttn, Attention2D) run slower than those
calls inside the schedule; Ulysses' whole-sequence calls do not (docs/PLANNER.md "Shard steps").
This script predicts every dense-mask ring-family run of the given `bench_gpu_ring` result files
with the factors at 1, takes the median of measured / predicted per pass, and writes the cluster
with those factors and a source line naming the runs.

Usage: python3 docs/planner/fit_shard_steps.py SEQPAR_CLI CLUSTER.json OUT.json RUNS.jsonl [RUNS.jsonl ...]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate import predict  # noqa: E402  (the same call, priced as validate.py prices a run)

RING_FAMILY = {"ring", "burst", "ring-return", "burst-return", "distflash", "double-ring", "attention2d",
               "attention2d-overlap"}
DENSE = {"causal", "full"}


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    cli, cluster_path, out_path, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    cluster = json.load(open(cluster_path))
    cluster["shard_step_factor"] = {"fwd": 1.0, "bwd": 1.0}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as unit:
        json.dump(cluster, unit)
    fwd, bwd, used = [], [], []
    try:
        for path in runs:
            for number, line in enumerate(open(path), 1):
                if not line.startswith('{"kind":"seqpar_ring"'):
                    continue
                d = json.loads(line)
                if d.get("ran") not in RING_FAMILY or d["mask"] not in DENSE or "fwd_ms" not in d or d.get("gpus") != \
                        cluster["gpus_per_node"] * cluster.get("nodes", 1):
                    continue
                p = predict(cli, unit.name, d)
                if "refusal" in p:
                    continue
                fwd.append(d["fwd_ms"] / p["fwd_ms"])
                bwd.append((d["fwdbwd_ms"] - d["fwd_ms"]) / p["bwd_ms"])
                used.append(f"{os.path.basename(path)}:{number}")
    finally:
        os.unlink(unit.name)
    if not used:
        sys.exit("no dense ring-family runs on a cluster of this many GPUs in the given files")
    f, b = statistics.median(fwd), statistics.median(bwd)
    cluster["shard_step_factor"] = {"fwd": round(f, 4), "bwd": round(b, 4)}
    cluster.setdefault("sources", []).append(
        f"shard_step_factor: the median of measured / predicted over {len(used)} dense ring-family runs "
        f"(forward {min(fwd):.3f}-{max(fwd):.3f}, backward {min(bwd):.3f}-{max(bwd):.3f}): " + ", ".join(used))
    json.dump(cluster, open(out_path, "w"), indent=2)
    print(f"shard_step_factor fwd {f:.4f} bwd {b:.4f} from {len(used)} runs -> {out_path}")


if __name__ == "__main__":
    main()
