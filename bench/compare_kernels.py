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
    peer = {(r["backend"], r["seq"], r["causal"]): r for r in peers if "error" not in r}
    print("| backend | mask | S | fwd TFLOP/s | fwd+bwd TFLOP/s | vs torch cuDNN fwd+bwd | vs torch flash fwd+bwd | torch cuDNN f+b | torch flash f+b |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        key_c, key_f = ("torch_cudnn", r["seq"], r["causal"]), ("torch_flash", r["seq"], r["causal"])
        c, f = peer.get(key_c), peer.get(key_f)
        ratio = lambda p: f'{r["fwdbwd_tflops"] / p["fwdbwd_tflops"]:.3f}x' if p else "n/a"
        print(f'| {r["backend"]} | {"causal" if r["causal"] else "full"} | {r["seq"]} | {r["fwd_tflops"]:.1f} | '
              f'{r["fwdbwd_tflops"]:.1f} | {ratio(c)} | {ratio(f)} | '
              f'{c["fwdbwd_tflops"]:.1f} | ' if c else "n/a | " , end="")
        print(f'{f["fwdbwd_tflops"]:.1f} |' if f else "n/a |")


if __name__ == "__main__":
    main()
