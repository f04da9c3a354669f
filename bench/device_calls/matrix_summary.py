#!/usr/bin/env python3
"""The summary a device call prints after its `bench_gpu_ring` matrices: every run of each
$OUT/matrix_*.jsonl (algorithm asked, what ran, fwd+bwd ms, head groups, peak extra GiB, the
fraction of the one-GPU kernel where measured) and, per length, `auto`
over the fastest of the others in the same file.

Usage: python3 bench/device_calls/matrix_summary.py OUT_DIR
"""
import glob
import json
import os
import sys


def main(out):
    for f in sorted(glob.glob(os.path.join(out, "matrix_*.jsonl"))):
        tag = os.path.basename(f)[len("matrix_"):-len(".jsonl")]
        rows = [json.loads(l) for l in open(f) if l.startswith('{"kind":"seqpar_ring"')]
        for S in sorted({r["seq"] for r in rows}):
            at = {r["algo"]: r for r in rows if r["seq"] == S and "fwdbwd_ms" in r}
            for a, r in at.items():
                print(f"{tag:16s} S={S:7d} {a:16s} ran {r.get('ran', a):16s} {r['fwdbwd_ms']:9.2f} ms "
                      f"groups {r.get('head_groups')} peak {r.get('peak_extra_GiB', 0):.2f} GiB"
                      + (f" of-1gpu {r['fraction_of_single_gpu']:.3f}" if "fraction_of_single_gpu" in r else ""))
            if "auto" in at and len(at) > 1:
                best = min((r["fwdbwd_ms"], a) for a, r in at.items() if a != "auto")
                print(f"  auto/fastest {at['auto']['fwdbwd_ms'] / best[0]:.3f} (fastest {best[1]})")


if __name__ == "__main__":
    main(sys.argv[1])
