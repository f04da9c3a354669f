"""backend_pairs.py: the pair the library's backend runs per mask, from ab_masks.py's JSON lines, for
logs cut short too (ab_masks.py prints its own table only at the end; run_mask_sweep.sh's calls ran
out of time at 16K twice). Per mask row: the backend's forward (routed_fwd) and backward (routed),
their fwd+bwd against compiled flex, and over our dense causal fwd+bwd with q80 (the log's "causal"
row). Usage: python3 dev/hopper_attention/backend_pairs.py LOG [LOG ...]"""
import json
import sys


def rows(path):
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a line cut by the timeout
                pass


def main(paths):
    print("| S | mask | forward | backward | fwd+bwd | flex fwd+bwd | / flex | vs causal |")
    print("|" + " --- |" * 8)
    for path in paths:
        causal = {}
        for r in rows(path):
            if r.get("mask") == "causal" and r.get("peer"):
                causal[r["seq"]] = r.get("ours_fb_q80_tflops")
                print("| %d | dense causal (cuDNN) | ours fwd %.0f / %.0f | | q80 %.0f | %.0f | %.2fx | |" % (
                    r["seq"], r["ours_fwd_tflops"], r["peer_fwd_tflops"], r["ours_fb_q80_tflops"], r["peer_fb_tflops"],
                    r["ours_fb_q80_tflops"] / r["peer_fb_tflops"]))
                continue
            if "flex_fb_tflops" not in r or r.get("routed") is None:
                continue
            f, b = r.get("routed_fwd"), r["routed"]
            # An extra forward (--fwd-variants, timed as ours_fwd_<name>) has its own fwd+bwd keys;
            # the main one (--fwd) those named by the backward alone.
            extra = "ours_fwd_%s_tflops" % f in r
            v = r.get("ours_fb_%s_%s_tflops" % (f, b)) if extra else r.get("ours_fb_%s_tflops" % b)
            if v is None:
                print("| %d | %s | %s | %s | not timed | | | |" % (r["seq"], r["mask"], f, b))
                continue
            ref = causal.get(r["seq"])
            print("| %d | %s | %s | %s | %.1f | %.1f | %.2fx | %s |" % (
                r["seq"], r["mask"], f, b, v, r["flex_fb_tflops"], v / r["flex_fb_tflops"],
                "%.2f" % (v / ref) if ref else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
