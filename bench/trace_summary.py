"""Summarises the step milestones that `bench_gpu_ring --trace` prints ("kind":"seqpar_trace",
one line per rank and configuration): for each rank, the time from one milestone to the next
on its compute stream, grouped by phase and head group, so a timeline's gaps (exposed
transfers, passes over memory, tails) stand out. Other lines are passed through.
Usage: python3 bench/trace_summary.py < trace.jsonl"""
import json
import sys


def main():
    for line in sys.stdin:
        try:
            rec = json.loads(line)
        except ValueError:
            print(line.rstrip()[:300])
            continue
        if rec.get("kind") != "seqpar_trace":
            print(json.dumps(rec))
            continue
        print(f"== {rec['algo']} S={rec['seq']} rank {rec['rank']}")
        prev, parts = 0.0, []
        for name, t in rec["marks"]:
            parts.append(f"{name} +{t - prev:.3f}")
            prev = t
        print("   " + " | ".join(parts) + f" | total {prev:.3f} ms")


if __name__ == "__main__":
    main()
