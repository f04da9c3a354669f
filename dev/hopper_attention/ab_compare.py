#!/usr/bin/env python3
"""ab_compare.py: the lab's A/B of our sm_90a forward kernels against PyTorch's cuDNN SDPA in ONE
process, on the SAME input tensors, with the contenders interleaved round by round (so clock
and power drift between separate runs does not pick the winner).

Problem: bf16, B = 1, q/k/v stored [B, S, H, D] (our layout; SDPA sees transpose views),
uniform [-1, 1) inputs, scale 1/sqrt(D); FLOPs = 4 B S^2 H D, half for causal. Each round
times every contender over `reps` back-to-back calls with an event between each; the reported
figure is the median over all rounds' intervals.

At the first length it also checks correctness at full size: for sampled query rows of every
head, an fp32 reference (torch, on upcast inputs) against our O and LSE and against cuDNN's O.

Usage: python3 ab_compare.py --lib build/libhopper_fwd.so --seqs 8192,16384,32768 \
           --variants pingpong,pp176 [--kv-heads 32,8] [--dim 128] [--rounds 8] [--reps 4]
"""
import argparse
import ctypes
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def load(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.hopper_fwd.restype = ctypes.c_int
    lib.hopper_fwd.argtypes = [ctypes.c_char_p] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    return lib


def uniform(gen, *shape):
    return (torch.rand(*shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def reference_rows(q, k, v, rows, causal, scale):
    """fp32 O [n, H, D] and LSE [H, n] for the given query rows (GQA by head index)."""
    H, Hkv = q.shape[2], k.shape[2]
    qr = q[0, rows].float().transpose(0, 1)  # [H, n, D]
    kf = k[0].float().transpose(0, 1).repeat_interleave(H // Hkv, dim=0)  # [H, S, D]
    vf = v[0].float().transpose(0, 1).repeat_interleave(H // Hkv, dim=0)
    s = torch.matmul(qr, kf.transpose(1, 2)) * scale  # [H, n, S]
    if causal:
        keys = torch.arange(k.shape[1], device="cuda")
        s = s.masked_fill(keys[None, None, :] > rows[None, :, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, n]
    o = torch.matmul(torch.softmax(s, dim=-1), vf)  # [H, n, D]
    return o.transpose(0, 1), lse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--seqs", default="8192,16384,32768")
    ap.add_argument("--variants", default="pingpong,pp176")
    ap.add_argument("--kv-heads", default="32,8")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--check-rows", type=int, default=256)
    ap.add_argument("--causal", default="0,1", help="masks to run: 0 full, 1 causal")
    a = ap.parse_args()
    lib = load(a.lib)
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0), flush=True)
    variants = a.variants.split(",")
    H, D = a.heads, a.dim
    scale = D ** -0.5
    seqs = [int(x) for x in a.seqs.split(",")]
    for S in seqs:
        for causal in (int(x) for x in a.causal.split(",")):
            for Hkv in (int(x) for x in a.kv_heads.split(",")):
                gen = torch.Generator(device="cuda").manual_seed(S * 10 + causal + Hkv)
                q, k, v = uniform(gen, 1, S, H, D), uniform(gen, 1, S, Hkv, D), uniform(gen, 1, S, Hkv, D)
                o = {vn: torch.empty(1, S, H, D, device="cuda", dtype=torch.bfloat16) for vn in variants}
                lse = {vn: torch.empty(1, H, S, device="cuda", dtype=torch.float32) for vn in variants}
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                stream = torch.cuda.current_stream().cuda_stream
                fns = {}
                for vn in variants:
                    def ours(vn=vn):
                        rc = lib.hopper_fwd(vn.encode(), q.data_ptr(), k.data_ptr(), v.data_ptr(), o[vn].data_ptr(),
                                            lse[vn].data_ptr(), 1, H, Hkv, S, S, D, causal, 0, stream)
                        if rc != 0:
                            raise RuntimeError("hopper_fwd %s failed: %d" % (vn, rc))
                    fns["ours:" + vn] = ours
                cudnn_out = {}

                def cudnn():
                    cudnn_out["o"] = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal),
                                                                    enable_gqa=(H != Hkv))
                fns["cudnn"] = cudnn
                times = {name: [] for name in fns}
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    for fn in fns.values():
                        fn()
                        fn()
                    torch.cuda.synchronize()
                    names = list(fns)
                    for r in range(a.rounds):
                        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
                        for name in order:
                            ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps + 1)]
                            ev[0].record()
                            for i in range(a.reps):
                                fns[name]()
                                ev[i + 1].record()
                            ev[-1].synchronize()
                            times[name] += [ev[i].elapsed_time(ev[i + 1]) for i in range(a.reps)]
                flops = 4.0 * S * S * H * D * (0.5 if causal else 1.0)
                med_cudnn = statistics.median(times["cudnn"])
                for name in names:
                    med = statistics.median(times[name])
                    print("AB S=%d causal=%d H=%d Hkv=%d D=%d %-15s ms=%.3f (min %.3f max %.3f) TFLOPs=%.1f  x cudnn %.3f"
                          % (S, causal, H, Hkv, D, name, med, min(times[name]), max(times[name]),
                             flops / (med * 1e-3) / 1e12, med_cudnn / med), flush=True)
                if S == seqs[0] and a.check_rows > 0:
                    rows = torch.randperm(S, device="cuda", generator=gen)[: a.check_rows].sort().values
                    o_ref, lse_ref = reference_rows(q, k, v, rows, causal, scale)
                    c_err = (cudnn_out["o"].transpose(1, 2)[0, rows].float() - o_ref).abs().max().item()
                    for vn in variants:
                        o_err = (o[vn][0, rows].float() - o_ref).abs().max().item()
                        l_err = (lse[vn][0][:, rows] - lse_ref).abs().max().item()
                        full_diff = (o[vn].float() - cudnn_out["o"].transpose(1, 2).float()).abs().max().item()
                        print("CHECKBIG S=%d causal=%d Hkv=%d %s: %d sampled rows vs fp32 ref: O err %.3e (cudnn %.3e)"
                              " LSE err %.3e; all rows |ours - cudnn| max %.3e %s"
                              % (S, causal, Hkv, vn, len(rows), o_err, c_err, l_err, full_diff,
                                 "ok" if o_err <= 2 * c_err + 4e-3 and l_err < 1e-3 else "SUSPECT"), flush=True)
                del q, k, v, o, lse, qt, kt, vt, cudnn_out
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
