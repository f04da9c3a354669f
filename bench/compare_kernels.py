"""Joins the JSON lines of bench/gpu_attention_bench (--json) and bench/torch_sdpa_peer.py from
one run on one GPU and prints a markdown table with seqpar's throughput as a ratio of each
peer's. Usage: python3 bench/compare_kernels.py ours.jsonl peer.jsonl"""
import json, sys


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main():
    ours, peers = load(sys.argv[1]), load(sys.argv[2])
    key = lambda r: (r["seq"], r["causal"], r.get("kv_heads", r.get("heads")))
    peer = {(r["backend"],) + key(r): r for r in peers if "error" not in r}
    print("| backend | mask | S | H:Hkv | fwd TFLOP/s | vs torch cuDNN fwd | vs torch flash fwd | fwd+bwd TFLOP/s | vs torch cuDNN fwd+bwd | vs torch flash fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        c = peer.get(("torch_cudnn",) + key(r))
        f = peer.get(("torch_flash",) + key(r))
        def ratio(p, key):
            return f'{r[key] / p[key]:.3f}x' if p and key in r and key in p else "n/a"
        fb = f'{r["fwdbwd_tflops"]:.1f}' if "fwdbwd_tflops" in r else "n/a"
        print(f'| {r["backend"]} | {"causal" if r["causal"] else "full"} | {r["seq"]} | '
              f'{r["heads"]}:{r.get("kv_heads", r["heads"])} | {r["fwd_tflops"]:.1f} | '
              f'{ratio(c, "fwd_tflops")} | {ratio(f, "fwd_tflops")} | {fb} | '
              f'{ratio(c, "fwdbwd_tflops")} | {ratio(f, "fwdbwd_tflops")} |')
    print()
    print("| peer | mask | S | Hkv | fwd TFLOP/s | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for (backend, seq, causal, hkv), p in sorted(peer.items()):
        print(f'| {backend} | {"causal" if causal else "full"} | {seq} | {hkv} | {p["fwd_tflops"]:.1f} | '
              f'{p["fwdbwd_tflops"]:.1f} |')


if __name__ == "__main__":
    main()
