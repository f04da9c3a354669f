"""Joins the JSON lines of seqpar's multi-GPU benchmark ("kind":"seqpar_ring", one line per
S and algo: ring | burst | auto | distflash | ulysses ...) with those of its PyTorch peer,
bench/torch_cp_peer.py ("kind":"torch_cp"), run on the same GPUs, and prints a Markdown table:
one row per (GPUs, K/V heads, mask, S, algo), a problem's rows under one another, with the
bytes each rank sent (forward + backward, the largest rank's), our forward + backward time and
TFLOP/s per GPU, how many times faster
than PyTorch context parallel we are (PyTorch's time / ours, > 1 means seqpar is faster),
our TFLOP/s per GPU as a fraction of our single-GPU kernel at the same tokens per GPU,
both peak extra memories and their ratio (ours / PyTorch's). Below it, the longest S that
each of our algos and PyTorch ran, and the ratio of our best longest to PyTorch's longest.
Cells without data show "-"; failed runs show "OOM" when the error mentions memory,
"skip" when the run was skipped for time, "err" otherwise. Lines that are not JSON objects
are ignored.
Usage: python3 bench/compare_multi_gpu.py ours.jsonl peer.jsonl"""
import json
import sys

ALGO_ORDER = {"ring": 0, "burst": 1, "auto": 2, "distflash": 3, "ulysses": 4, "ulysses-ring": 5}
CAUSAL = "causal"


def load(path, kind):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and r.get("kind") == kind and isinstance(r.get("seq"), (int, float)):
                rows.append(r)
    return rows


def ok(r):
    return r is not None and "error" not in r


def num(r, key):
    """r[key] as a float when r ran and has it, else None."""
    if not ok(r):
        return None
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def failed(r):
    """The cell text for a failed run, or None when r ran (or is absent)."""
    if r is None or "error" not in r:
        return None
    e = str(r["error"]).lower()
    if "memory" in e:
        return "OOM"
    if e.startswith("skipped"):
        return "skip"
    return "err"


def cell(r, key, fmt):
    f = failed(r)
    if f:
        return f
    v = num(r, key)
    return "-" if v is None else fmt.format(v)


def ratio(a, b, fmt):
    return "-" if a is None or b is None or b == 0 else fmt.format(a / b)


def prefer(old, new):
    """Of two lines for the same key, keep a successful one; of two failures, an out-of-memory
    one (the cause, where other ranks then report the job's teardown); else the later one."""
    if old is None or ok(new):
        return new
    if ok(old) or (failed(old) == "OOM" and failed(new) != "OOM"):
        return old
    return new


def fmt_seq(s):
    s = int(s)
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if s >= n and s % n == 0:
            return f"{s // n}{unit}"
    return str(s)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours_rows = load(sys.argv[1], "seqpar_ring")
    peer_rows = load(sys.argv[2], "torch_cp")

    # The GPU count of a line; a peer error line may lack it, so fall back on the only count seen.
    counts = sorted({int(r["gpus"]) for r in ours_rows + peer_rows if isinstance(r.get("gpus"), int)})
    default_gpus = counts[0] if len(counts) == 1 else None

    def gpus_of(r):
        g = r.get("gpus")
        return int(g) if isinstance(g, int) else default_gpus

    def kv_of(r):
        return int(r.get("kv_heads") or r.get("heads") or 0)

    # Keys: (gpus, kv_heads, mask, seq, algo); an error line lacks kv_heads and mask, so it
    # takes the only ones seen (or 0 and causal).
    kvs = sorted({kv_of(r) for r in ours_rows + peer_rows if kv_of(r)})
    default_kv = kvs[0] if len(kvs) == 1 else 0

    def problem(r):
        return (gpus_of(r), kv_of(r) or default_kv, str(r.get("mask", CAUSAL)))

    ours = {}
    for r in ours_rows:
        key = problem(r) + (int(r["seq"]), str(r.get("algo", "?")))
        ours[key] = prefer(ours.get(key), r)
    # Peer: one line per (gpus, kv_heads, seq); a cudnn line wins over other backends, then prefer().
    peer = {}
    for r in peer_rows:
        key = (gpus_of(r), kv_of(r) or default_kv, int(r["seq"]))
        old = peer.get(key)
        if old is None:
            peer[key] = r
            continue
        old_cudnn, new_cudnn = old.get("backend", "cudnn") == "cudnn", r.get("backend", "cudnn") == "cudnn"
        peer[key] = prefer(old, r) if old_cudnn == new_cudnn else (r if new_cudnn else old)
    backends = sorted({str(r.get("backend")) for r in peer.values() if r.get("backend")})

    keys = set(ours)
    for g, kv, s in peer:  # S that only PyTorch ran still gets a row
        if not any(k[0] == g and k[1] == kv and k[2] == CAUSAL and k[3] == s for k in ours):
            keys.add((g, kv, CAUSAL, s, None))

    def order(k):
        return (k[0] if k[0] is not None else -1, -k[1], k[2] != CAUSAL, k[2], k[3],
                ALGO_ORDER.get(k[4], 9) if k[4] is not None else 10, k[4] or "")

    def mib_sent(r):
        sent = r.get("sent_bytes_per_rank_max") if ok(r) else None
        if not isinstance(sent, dict):
            return "-"
        return f"{(sent.get('forward', 0) + sent.get('backward', 0)) / 2**20:.0f}"

    print(f"PyTorch peer: context parallel, backend {', '.join(backends) or '-'}")
    print()
    print("| GPUs | K/V heads | mask | S | tokens/GPU | algo | MiB sent/rank | fwd+bwd ms | TFLOP/s/GPU | x faster "
          "| of 1-GPU kernel | peak extra GiB | torch fwd+bwd ms | torch TFLOP/s/GPU | torch peak extra GiB "
          "| memory ours/torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(keys, key=order):
        g, kv, mask, s, algo = k
        o = ours.get(k) if algo is not None else None
        p = peer.get((g, kv, s)) if mask == CAUSAL else None
        tokens = None
        for r in (o, p):
            if r is not None and isinstance(r.get("tokens_per_gpu"), (int, float)):
                tokens = int(r["tokens_per_gpu"])
                break
        if tokens is None and g:
            tokens = s // g
        if algo is None:
            label = "-"
        elif algo == "auto" and o is not None and o.get("backward"):
            label = f"auto ({o['backward']})"
        else:
            label = algo
        o_ms, p_ms = num(o, "fwdbwd_ms"), num(p, "fwdbwd_ms")
        o_tf, single = num(o, "fwdbwd_tflops_per_gpu"), num(o, "single_gpu_tflops")
        o_mem, p_mem = num(o, "peak_extra_GiB"), num(p, "peak_extra_GiB")
        faster = ratio(p_ms, o_ms, "{:.2f}x")
        of_single = ratio(o_tf, single, "{:.0%}")
        mem = ratio(o_mem, p_mem, "{:.0%}")
        print(f"| {g if g is not None else '-'} | {kv or '-'} | {mask} | {fmt_seq(s)} "
              f"| {tokens if tokens is not None else '-'} | {label} | {mib_sent(o)} "
              f"| {cell(o, 'fwdbwd_ms', '{:.1f}')} "
              f"| {cell(o, 'fwdbwd_tflops_per_gpu', '{:.1f}')} "
              f"| {faster} | {of_single} "
              f"| {cell(o, 'peak_extra_GiB', '{:.2f}')} "
              f"| {cell(p, 'fwdbwd_ms', '{:.1f}')} "
              f"| {cell(p, 'fwdbwd_tflops_per_gpu', '{:.1f}')} "
              f"| {cell(p, 'peak_extra_GiB', '{:.2f}')} "
              f"| {mem} |")

    # Longest S run successfully, per GPU count and K/V heads, causal.
    print()
    groups = sorted({(k[0], k[1]) for k in keys if k[2] == CAUSAL}, key=lambda x: (-1 if x[0] is None else x[0], -x[1]))
    for g, kv in groups:
        head = (f"{g} GPUs" if g is not None else "unknown GPU count") + f", {kv} K/V heads, causal"
        longest = {}
        for (kg, kkv, mask, s, algo), r in ours.items():
            if (kg, kkv, mask) == (g, kv, CAUSAL) and ok(r):
                longest[algo] = max(longest.get(algo, 0), s)
        torch_longest = max((s for (kg, kkv, s), r in peer.items() if (kg, kkv) == (g, kv) and ok(r)), default=0)
        parts = [f"seqpar {a}: {fmt_seq(v)}" for a, v in sorted(longest.items(), key=lambda x: ALGO_ORDER.get(x[0], 9))]
        ran = {k[4] for k in ours if (k[0], k[1], k[2]) == (g, kv, CAUSAL)}
        for a in sorted(ran - set(longest), key=lambda x: ALGO_ORDER.get(x, 9)):
            parts.append(f"seqpar {a}: none")
        parts.append(f"torch: {fmt_seq(torch_longest) if torch_longest else 'none'}")
        best = max(longest.values(), default=0)
        if best and torch_longest:
            verdict = f"our best longest / torch's longest = {best / torch_longest:.2f}x"
        else:
            verdict = "our best longest / torch's longest = -"
        print(f"Longest S run ({head}): " + ", ".join(parts) + f". {verdict}")


if __name__ == "__main__":
    main()
