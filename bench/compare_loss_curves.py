"""Compares training loss curves written by examples/hf_finetune.py --jsonl under the bf16 rule.

The three runs train the same model on the same data for the same steps: OURS (seqpar's
sequence-parallel attention, bf16, any number of ranks), PLAIN (transformers' SDPA on the whole
sequence in one process, bf16) and ORACLE (the same in fp32). Over the steps both runs have,
the rule holds when
    max_step |ours - oracle| <= 2 max_step |plain - oracle| + max_step |round_bf16(oracle) - oracle|
which is the rule CONVENTIONS.md applies to a tensor, applied to the curve. Prints one row per
step and the verdict, and exits 1 when the rule fails or a curve is missing or not finite.

Usage: python3 bench/compare_loss_curves.py OURS.jsonl PLAIN.jsonl ORACLE.jsonl
"""
import json
import math
import struct
import sys


def load(path):
    """{step: record} of the hf_finetune lines in path."""
    steps = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("kind") == "hf_finetune":
                    steps[int(r["step"])] = r
    return steps


def round_bf16(x):
    """x rounded to the nearest bf16 (ties to even), as a float."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ours, plain, oracle = (load(p) for p in sys.argv[1:])
    steps = sorted(set(ours) & set(plain) & set(oracle))
    if not steps:
        print("FAIL: no step is in all three curves")
        return 1
    first = ours[steps[0]]
    print(f"S = {first['seq']}, ours on {first['ranks']} rank(s); plain and oracle in one process")
    print()
    print("| step | ours | sdpa bf16 | sdpa fp32 | ours - fp32 | sdpa bf16 - fp32 | ours tokens/s | sdpa bf16 tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    err = plain_err = floor = 0.0
    finite = True
    for s in steps:
        o, p, r = ours[s]["loss"], plain[s]["loss"], oracle[s]["loss"]
        finite &= all(math.isfinite(x) for x in (o, p, r))
        err, plain_err = max(err, abs(o - r)), max(plain_err, abs(p - r))
        floor = max(floor, abs(round_bf16(r) - r))
        print(f"| {s} | {o:.5f} | {p:.5f} | {r:.5f} | {o - r:+.2e} | {p - r:+.2e} "
              f"| {ours[s]['tokens_per_s']:.0f} | {plain[s]['tokens_per_s']:.0f} |")
    bound = 2 * plain_err + floor
    ok = finite and err <= bound
    print()
    print(f"{'PASS' if ok else 'FAIL'}: max |ours - fp32| = {err:.3e}, bound 2 x {plain_err:.3e} + {floor:.3e} "
          f"= {bound:.3e} over {len(steps)} steps")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
