#!/usr/bin/env python3
"""clocks.py: the SM clock and board power while each standalone bench of a run_*.sh script ran.

Usage: python3 clocks.py bench.log clocks.csv
bench.log has "WINDOW <variant> start|end <date '+%Y/%m/%d %H:%M:%S.%N'>" lines around each bench;
clocks.csv is `nvidia-smi -i <gpu> --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader
-lms N` of the GPU the benches ran on. A bench's kernels are the samples of its window above 550 W
(allocation, input fill and warm-up draw less), less their first and last 0.3 s (the power reading
trails the load). Prints one CLOCKS line per window, after the BENCH lines.
"""
import datetime
import statistics
import sys


def ts(s):
    day, frac = (s.strip().split(".") + ["0"])[:2]
    return datetime.datetime.strptime(day, "%Y/%m/%d %H:%M:%S").timestamp() + float("0." + frac[:6])


samples = []
for line in open(sys.argv[2]):
    f = [x.strip() for x in line.split(",")]
    try:
        samples.append((ts(f[0]), float(f[1].split()[0]), float(f[2].split()[0])))
    except (ValueError, IndexError):
        pass
start = {}
for line in open(sys.argv[1]):
    w = line.split()
    if line.startswith("BENCH"):
        print(line.strip())
    elif line.startswith("WINDOW") and w[2] == "start":
        start[w[1]] = ts(w[3] + " " + w[4])
    elif line.startswith("WINDOW") and w[2] == "end":
        a, b = start.pop(w[1]), ts(w[3] + " " + w[4])
        hot = [s for s in samples if a < s[0] < b and s[2] > 550]
        if not hot:
            print("CLOCKS %-12s no sample above 550 W" % w[1])
            continue
        mid = [s for s in hot if hot[0][0] + 0.3 <= s[0] <= hot[-1][0] - 0.3] or hot
        print("CLOCKS %-12s %.2f s above 550 W, %d samples: SM clock median %.0f MHz (min %.0f max %.0f), "
              "power median %.0f W" % (w[1], hot[-1][0] - hot[0][0], len(mid), statistics.median(s[1] for s in mid),
                                       min(s[1] for s in mid), max(s[1] for s in mid),
                                       statistics.median(s[2] for s in mid)))
