"""The library's attention against PyTorch's SDPA in one process, interleaved: seqpar.torch.attention
on one rank (the executor, the backend SEQPAR_ATTN_BACKEND names, the delta step, the op's autograd:
what a PyTorch user of seqpar runs) and F.scaled_dot_product_attention on cuDNN (CPU: PyTorch's
default kernel), forward alone and forward + backward, B = 1, uniform [-1, 1) q, k, v and dO on
both sides, the same tensors. Rounds alternate which side goes first; each side's time is the
median over rounds of the mean of `reps` back-to-back calls between two CUDA events. One JSON line
per (S, mask): both sides' ms and TFLOP/s, ours / peer, and max |O_ours - O_peer| (a sanity check,
not the test: tests/ hold those). bench_gpu_attention times the backends without PyTorch, but in
its own process, so its peer runs separately and single cells move by about 5% (docs/RESULTS.md,
session u); this is the same-call figure.
Usage: python3 bench/torch_op_vs_sdpa.py [--seqs 8192,16384] [--masks causal,full] [--heads 32]
       [--kv-heads 8] [--dim 128] [--backend hopper] [--rounds 5] [--reps 3] [--device cuda]"""
import argparse
import json
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="8192,16384,32768,65536,131072")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads (default: --heads)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--backend", default="hopper", help="SEQPAR_ATTN_BACKEND for ours: hopper, cudnn, cuda, auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (float32: a smoke run of this script)")
    a = ap.parse_args()
    h, d = a.heads, a.dim
    hkv = a.kv_heads or h
    if h % hkv:
        raise SystemExit(f"--heads {h} is not a multiple of --kv-heads {hkv}")
    for m in a.masks.split(","):
        if m not in ("causal", "full"):
            raise SystemExit(f"--masks takes causal and full, not {m!r}")
    os.environ["SEQPAR_ATTN_BACKEND"] = a.backend if a.device == "cuda" else ""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import seqpar.torch as sp

    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    peer_backend = SDPBackend.CUDNN_ATTENTION if cuda else SDPBackend.MATH

    def clock():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_ms(t0, t1):
        if cuda:
            t1.synchronize()
            return t0.elapsed_time(t1)
        return (t1 - t0) * 1e3

    for s in [int(x) for x in a.seqs.split(",")]:
        gen = torch.Generator(device=a.device).manual_seed(s)

        def uniform(heads, grad):
            x = torch.rand(1, s, heads, d, device=a.device, dtype=torch.float32, generator=gen).mul_(2).sub_(1)
            return x.to(dtype).requires_grad_(grad)

        q, k, v, do = uniform(h, True), uniform(hkv, True), uniform(hkv, True), uniform(h, False)
        qt, kt, vt, dot = (x.detach().transpose(1, 2).requires_grad_(x.requires_grad) for x in (q, k, v, do))
        for mask in a.masks.split(","):
            causal = mask == "causal"

            def ours():
                return sp.attention(q, k, v, causal=causal, ranks=1)

            def peer():
                with sdpa_kernel([peer_backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hkv != h)

            def fwd(fn):
                def run():
                    with torch.no_grad():
                        fn()
                return run

            def fwd_bwd(fn, grad):
                def run():
                    fn().backward(grad)
                return run

            runs = {"ours_fwd": fwd(ours), "peer_fwd": fwd(peer),
                    "ours_fb": fwd_bwd(ours, do), "peer_fb": fwd_bwd(peer, dot)}
            diff = (ours().float() - peer().transpose(1, 2).float()).abs().max().item()
            for fn in runs.values():  # warm-up: plans, caches, autotuning
                fn()
            times = {n: [] for n in runs}
            for r in range(a.rounds):
                for kind in ("fwd", "fb"):
                    order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
                    for side in order:
                        n = f"{side}_{kind}"
                        t0 = clock()
                        for _ in range(a.reps):
                            runs[n]()
                        t1 = clock()
                        times[n].append(elapsed_ms(t0, t1) / a.reps)
            for x in (q, k, v, qt, kt, vt):
                x.grad = None
            ms = {n: statistics.median(t) for n, t in times.items()}
            flops = 4.0 * s * s * h * d * (0.5 if causal else 1.0)
            row = dict(kind="op_vs_sdpa", device=torch.cuda.get_device_name(0) if cuda else "cpu",
                       backend=a.backend if cuda else "cpu", peer="cudnn" if cuda else "math", seq=s, heads=h,
                       kv_heads=hkv, dim=d, causal=causal, rounds=a.rounds, reps=a.reps, max_abs_diff_o=diff)
            for n, t in ms.items():
                row[n + "_ms"] = round(t, 4)
                row[n + "_tflops"] = round((3.5 if n.endswith("_fb") else 1.0) * flops / t / 1e9, 1)
            row["fwd_ratio"] = round(ms["peer_fwd"] / ms["ours_fwd"], 3)
            row["fwdbwd_ratio"] = round(ms["peer_fb"] / ms["ours_fb"], 3)
            print(json.dumps(row), flush=True)
        del q, k, v, do, qt, kt, vt, dot
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
