"""One readable row per LM-head measurement (bench_gpu_lm_head's and bench/liger_flce_peer.py's
JSON lines, in the files given), then the peer's checks against the fp32 oracle as they are.
Usage: python3 lm_head_summary.py OURS.jsonl PEER.jsonl"""
import json
import os
import sys

for path in sys.argv[1:]:
    for line in open(path) if os.path.exists(path) else []:
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "ms_fwd_bwd" in r:
            print(f"{r.get('gemm', ''):7s} {r['kind']:22s} {str(r.get('chunk', '')):>5s} {r.get('logits', ''):5s} "
                  f"fwd+bwd {r['ms_fwd_bwd']:8.2f} fwd {r['ms_fwd']:7.2f} extra {r['peak_extra_bytes'] / 2**30:6.3f} GiB "
                  f"grads {r['grad_bytes'] / 2**30:5.3f} loss {r['loss']:.6f}")
        elif r.get("kind") == "lm_head_check":
            print(json.dumps(r))
