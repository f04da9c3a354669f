"""Joins bench_gpu_linear's and fla_linear_peer.py's JSON lines by length into one table: each
variant of ours and fla's forward and forward+backward times, and fla's time over ours (> 1:
ours faster). Usage: python3 bench/compare_linear.py ours.jsonl fla.jsonl"""
import json, sys


def load(path, kind):
    rows = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j.get("kind") == kind and "seq" in j:
            rows[(j["seq"], j.get("variant", ""))] = j
    return rows


def main():
    ours, fla = load(sys.argv[1], "seqpar_linear"), load(sys.argv[2], "fla_linear")
    fla = {seq: j for (seq, _), j in fla.items()}
    print("| N | variant | ours fwd ms | fla fwd ms | fla/ours | ours f+b ms | fla f+b ms | fla/ours | ours f+b TF/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sorted({s for (s, _) in ours} | set(fla)):
        f = fla.get(n, {})
        for variant, o in sorted((v, j) for (s, v), j in ours.items() if s == n) or [("", {})]:

            def ms(j, key):
                return f"{j[key]:.3f}" if key in j else (j.get("error") or j.get("fwdbwd_error") or "-")

            def ratio(key):
                return f"{f[key] / o[key]:.2f}" if key in o and key in f else "-"

            tf = f"{o['fwdbwd_tflops']:.1f}" if "fwdbwd_tflops" in o else "-"
            print(f"| {n} | {variant or '-'} | {ms(o, 'fwd_ms')} | {ms(f, 'fwd_ms')} | {ratio('fwd_ms')} | "
                  f"{ms(o, 'fwdbwd_ms')} | {ms(f, 'fwdbwd_ms')} | {ratio('fwdbwd_ms')} | {tf} |")

if __name__ == "__main__":
    main()
