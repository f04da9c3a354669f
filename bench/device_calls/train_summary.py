#!/usr/bin/env python3
"""The lines a device call prints after a `seqpar train --json --profile` run: per step, tokens/s,
MFU (989 TFLOP/s basis), the device peak, the loss and the step's milliseconds of the work kinds
asked for (`work_ms`: attention, products, rope, between_ops, pass, step, ...).

Usage: python3 bench/device_calls/train_summary.py RUN.jsonl TAG [KIND ...]
"""
import json
import sys


def main(path, tag, kinds):
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "step" not in r or "tokens_per_s" not in r:
            continue
        w = r.get("work_ms", {})
        print(tag, "step", r["step"], "tokens/s %.0f" % r["tokens_per_s"], "mfu %.4f" % r.get("mfu_989", 0),
              "peak GiB %.1f" % (r.get("device_peak_bytes", 0) / 2**30), "loss %.4f" % r.get("loss", 0),
              " ".join("%s %.1f" % (k, w.get(k, 0)) for k in kinds))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
