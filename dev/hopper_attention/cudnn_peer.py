#!/usr/bin/env python3
"""cudnn_peer.py: the peer side of the lab's A/B: PyTorch's cuDNN SDPA forward, timed the way
hopper_fwd_test times ours (CUDA events, median of the repetitions after warm-up), on the same
problem: bf16, B = 1, q/k/v stored [B, S, H, D] (our layout; SDPA sees them through a
transpose view), uniform [-1, 1) inputs, scale 1/sqrt(D); FLOPs = 4 B S^2 H D, half for causal.

Usage: python3 cudnn_peer.py S[,S...] [--heads 32] [--kv-heads 32,8] [--dims 128] [--reps 10]
Prints one 'BENCH cudnn ...' line per problem. GQA goes through enable_gqa=True when the cuDNN
backend takes it; if it refuses, K/V are expanded to H heads (said in the line as 'expanded').
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench_one(S, causal, H, Hkv, D, reps):
    gen = torch.Generator(device="cuda").manual_seed(1234)

    def uniform(*shape):
        return (torch.rand(*shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)

    q = uniform(1, S, H, D)
    k = uniform(1, S, Hkv, D)
    v = uniform(1, S, Hkv, D)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    mode = "native"

    def run_native():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=(H != Hkv))

    fn = run_native
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # cuDNN backend refusing enable_gqa: expand K/V instead
            if H == Hkv:
                raise
            mode = "expanded(%s)" % type(e).__name__
            ke = kt.repeat_interleave(H // Hkv, dim=1)
            ve = vt.repeat_interleave(H // Hkv, dim=1)

            def run_expanded():
                return F.scaled_dot_product_attention(qt, ke, ve, is_causal=bool(causal))

            fn = run_expanded
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        # Back-to-back calls with an event between each (host work overlaps the previous
        # kernel, as in hopper_fwd_test); median interval.
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        ev[0].record()
        for r in range(reps):
            fn()
            ev[r + 1].record()
        ev[reps].synchronize()
        times = [ev[r].elapsed_time(ev[r + 1]) for r in range(reps)]
    med = statistics.median(times)
    flops = 4.0 * S * S * H * D * (0.5 if causal else 1.0)
    print(
        "BENCH cudnn variant=%s S=%d causal=%d H=%d Hkv=%d D=%d ms=%.3f (min %.3f max %.3f) TFLOPs=%.1f"
        % (mode, S, causal, H, Hkv, D, med, min(times), max(times), flops / (med * 1e-3) / 1e12),
        flush=True,
    )
    del q, k, v, qt, kt, vt
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seqs")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", default="32,8")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0), flush=True)
    for D in (int(x) for x in a.dims.split(",")):
        for S in (int(x) for x in a.seqs.split(",")):
            for causal in (0, 1):
                for Hkv in (int(x) for x in a.kv_heads.split(",")):
                    bench_one(S, causal, a.heads, Hkv, D, a.reps)


if __name__ == "__main__":
    main()
