"""Compares `seqpar train --json` loss curves of the same run on different rank or GPU counts
(the first file is the reference, e.g. one GPU) and writes them as one SVG.

For each other run: the largest |loss - reference loss| over the steps both have, absolute and
relative to the reference's loss at that step, and the same for a yardstick run when given
(--yardstick FILE: the reference's run again with only the reduction order changed, e.g. two
thread ranks sharing the GPU), whose difference is what bf16 training's round-off alone makes;
bf16's unit round-off (2^-8) is printed beside them. One JSON line per compared run.

    python3 bench/train_curves.py ONE_GPU.jsonl FOUR_GPUS.jsonl [--yardstick Y.jsonl]
        [--names "1 GPU,4 GPUs"] [--plot curves.svg] [--title T]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svg_curves import svg  # noqa: E402


def losses(path):
    """The per-step losses of a seqpar train --json file, in step order."""
    steps = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "loss" in r and "step" in r:
                    steps[int(r["step"])] = float(r["loss"])
    return [steps[k] for k in sorted(steps)]


def gap(a, ref):
    n = min(len(a), len(ref))
    if n == 0:
        return None
    i = max(range(n), key=lambda k: abs(a[k] - ref[k]))
    return {"steps": n, "max_abs": abs(a[i] - ref[i]), "max_rel": abs(a[i] - ref[i]) / abs(ref[i]), "at_step": i}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="seqpar train --json files; the first is the reference")
    ap.add_argument("--yardstick", help="the reference run with only its reduction order changed")
    ap.add_argument("--names", help="comma-separated curve names (default: file names)")
    ap.add_argument("--plot", help="write the curves as an SVG here")
    ap.add_argument("--title", default="seqpar train loss")
    a = ap.parse_args()
    names = a.names.split(",") if a.names else [os.path.basename(p) for p in a.runs]
    if len(names) != len(a.runs):
        sys.exit("--names must name every run")
    curves = {n: losses(p) for n, p in zip(names, a.runs)}
    ref = curves[names[0]]
    if not ref:
        sys.exit(f"{a.runs[0]}: no loss lines")
    yard = gap(losses(a.yardstick), ref) if a.yardstick else None
    for n in names[1:]:
        g = gap(curves[n], ref)
        print(json.dumps({"kind": "train_curves", "run": n, "reference": names[0], "gap": g, "yardstick_gap": yard,
                          "bf16_unit_roundoff": 2.0 ** -8}))
    if a.plot:
        svg(a.plot, curves, a.title)


if __name__ == "__main__":
    main()
