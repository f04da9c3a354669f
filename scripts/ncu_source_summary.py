#!/usr/bin/env python3
"""Summary of an Nsight Compute source-level export (one kernel launch): where the kernel's
instructions and stall samples go, by SASS opcode, and the instructions that stall most.

The export comes from
    ncu --section SourceCounters --section WarpStateStats -o REPORT <command>
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > FILE.csv
(scripts/profile_kernels.sh takes both steps). Plain CSV or gzip (.gz) is read.

Usage: python3 scripts/ncu_source_summary.py FILE.csv[.gz] [--top N]
"""
import argparse
import collections
import csv
import gzip
import re


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header; each later row is one SASS instruction.
    header = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    names = rows[header]
    body = [r for r in rows[header + 1:] if len(r) >= len(names) - 1]
    return names, body


def opcode(source):
    """The opcode of a SASS line without its predicate and modifiers: "@!P0 LDSM.16.M88.4" -> LDSM."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv export (plain or .gz)")
    ap.add_argument("--top", type=int, default=10, help="instructions listed by stall samples")
    args = ap.parse_args()
    names, body = read_rows(args.csv)
    col = {n: i for i, n in enumerate(names)}
    executed_i = col["Instructions Executed"]
    samples_i = col["Warp Stall Sampling (All Samples)"]
    source_i = col["Source"]
    stall_cols = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]

    def number(row, i):
        return int(row[i] or 0) if row[i] not in ("-", "") else 0

    executed = collections.Counter()
    samples = collections.Counter()
    stalls = collections.Counter()
    for r in body:
        op = opcode(r[source_i])
        executed[op] += number(r, executed_i)
        samples[op] += number(r, samples_i)
        for n in stall_cols:
            stalls[n[len("stall_"):]] += number(r, col[n])
    total_exec, total_samples = sum(executed.values()), max(1, sum(samples.values()))
    mma = executed["HMMA"] or 1
    print(f"warp instructions executed: {total_exec:,} ({total_exec / mma:.2f} per HMMA); "
          f"stall samples: {total_samples:,}")
    print(f"{'opcode':10s} {'executed':>15s} {'per HMMA':>9s} {'of exec':>8s} {'of samples':>10s}")
    for op, n in executed.most_common(20):
        print(f"{op:10s} {n:>15,} {n / mma:9.2f} {100 * n / total_exec:7.1f}% {100 * samples[op] / total_samples:9.1f}%")
    print("stall reasons (share of samples): " +
          ", ".join(f"{k} {100 * v / total_samples:.1f}%" for k, v in stalls.most_common(10)))
    print("instructions with the most stall samples (address offset, executions per HMMA, samples):")
    base = int(body[0][col["Address"]], 16)
    ranked = sorted(body, key=lambda r: number(r, samples_i), reverse=True)[: args.top]
    for r in ranked:
        print(f"  {int(r[col['Address']], 16) - base:6x} {number(r, executed_i) / mma:6.3f} "
              f"{number(r, samples_i):8,}  {r[source_i].strip()[:70]}")


if __name__ == "__main__":
    main()
