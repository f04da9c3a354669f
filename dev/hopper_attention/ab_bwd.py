#!/usr/bin/env python3
"""ab_bwd.py: the lab's A/B of our sm_90a BACKWARD kernel against PyTorch's cuDNN SDPA backward in
ONE process, on the SAME inputs, interleaved round by round (as ab_compare.py does for the forward).

Problem: bf16, B = 1, q/k/v/dO stored [B, S, H, D] (our layout; SDPA sees transpose views),
uniform [-1, 1) inputs and dO, scale 1/sqrt(D). cuDNN: the forward runs once under
sdpa_kernel(CUDNN_ATTENTION); each timed call is torch.autograd.grad(out, (q, k, v), dO,
retain_graph=True). Ours: O and LSE from our forward (libhopper_fwd.so, once); each timed call
is the whole backward (zero the dQ accumulator, D = rowsum(dO * O) and LSE preprocessing, main
kernel, dQ to bf16). FLOPs = 2.5 x 4 B S^2 H D, half for causal.

--extra-lib NAME=PATH loads another build of the backward library (e.g. the commit before) into
the same process; a variant written VARIANT@NAME runs from it, so two builds are interleaved with
cuDNN in one call.

At every length it compares each variant's dQ, dK, dV with cuDNN's over all elements; at the first
length, the last variant's and cuDNN's against an fp32 torch reference for two heads.

Usage: python3 ab_bwd.py --fwd-lib build/libhopper_fwd.so --bwd-lib build/libhopper_bwd.so \
           --seqs 8192,16384,32768 [--kv-heads 32] [--dim 128] [--rounds 5] [--reps 2] \
           [--extra-lib before=old/libhopper_bwd.so --variants q80@before,q80]
"""
import argparse
import ctypes
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def load(fwd_path, bwd_path):
    f = ctypes.CDLL(fwd_path)
    f.hopper_fwd.restype = ctypes.c_int
    f.hopper_fwd.argtypes = [ctypes.c_char_p] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    return f, load_bwd(bwd_path)


def load_bwd(bwd_path):
    b = ctypes.CDLL(bwd_path)
    b.hopper_bwd.restype = ctypes.c_int
    b.hopper_bwd.argtypes = [ctypes.c_void_p] * 11 + [ctypes.c_int] * 10 + [ctypes.c_void_p]
    b.hopper_bwd_workspace.restype = ctypes.c_size_t
    b.hopper_bwd_workspace.argtypes = [ctypes.c_int] * 4
    return b


VARIANTS = {"base": 0, "defer": 1, "memset": 2, "sfirst": 3, "q128": 4, "q80": 5, "q80h": 7, "q128h": 8, "baseh": 9}  # variants.cuh's dispatch_bwd


def uniform(gen, *shape):
    return (torch.rand(*shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def reference_head(q, k, v, do, h, causal, scale):
    """fp32 dq [S, D], dk, dv [S, D] of query head h (MHA: K/V head h)."""
    qh, kh, vh, doh = (x[0, :, h].float() for x in (q, k, v, do))
    s = (qh @ kh.T) * scale
    if causal:
        n = s.shape[0]
        s = s.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    o = p @ vh
    dp = doh @ vh.T
    delta = (doh * o).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    del dp
    return (ds @ kh) * scale, (ds.T @ qh) * scale, p.T @ doh


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fwd-lib", required=True)
    ap.add_argument("--bwd-lib", required=True)
    ap.add_argument("--seqs", default="8192,16384,32768")
    ap.add_argument("--kv-heads", default="32")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--check", type=int, default=1)
    ap.add_argument("--variants", default="base,defer")
    ap.add_argument("--extra-lib", action="append", default=[], help="NAME=PATH: variants VARIANT@NAME run from it")
    a = ap.parse_args()
    lf, lb = load(a.fwd_lib, a.bwd_lib)
    libs = {"": lb}
    for spec in a.extra_lib:
        name, path = spec.split("=", 1)
        libs[name] = load_bwd(path)
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0), flush=True)
    H, D = a.heads, a.dim
    scale = D ** -0.5
    fwd_variant = b"pp192" if D == 128 else b"m192"
    seqs = [int(x) for x in a.seqs.split(",")]
    summary = []
    variants = a.variants.split(",")
    for S in seqs:
        for causal in (0, 1):
            for Hkv in (int(x) for x in a.kv_heads.split(",")):
                gen = torch.Generator(device="cuda").manual_seed(S * 10 + causal + Hkv)
                q, k, v, do = uniform(gen, 1, S, H, D), uniform(gen, 1, S, Hkv, D), uniform(gen, 1, S, Hkv, D), \
                    uniform(gen, 1, S, H, D)
                stream = torch.cuda.current_stream().cuda_stream
                # cuDNN side: leaves in our layout, SDPA on transpose views.
                ql, kl, vl = (x.clone().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(ql.transpose(1, 2), kl.transpose(1, 2), vl.transpose(1, 2),
                                                         is_causal=bool(causal), enable_gqa=(H != Hkv))
                dot = torch.empty_like(out)  # same strides as out, so autograd needs no copy
                dot.copy_(do.transpose(1, 2))
                grads = {}

                def cudnn():
                    grads["g"] = torch.autograd.grad(out, (ql, kl, vl), dot, retain_graph=True)

                # Ours: O and LSE from our forward, then the backward.
                o = torch.empty(1, S, H, D, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(1, H, S, device="cuda", dtype=torch.float32)
                rc = lf.hopper_fwd(fwd_variant, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                   1, H, Hkv, S, S, D, causal, 0, stream)
                assert rc == 0, rc
                do_c = dot.transpose(1, 2)
                if not do_c.is_contiguous():
                    do_c = do.contiguous()
                ws = torch.empty(max(x.hopper_bwd_workspace(1, H, S, D) for x in libs.values()), device="cuda",
                                 dtype=torch.uint8)
                res = {vn: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) for vn in variants}
                fns = {}
                for vn in variants:
                    def ours(vn=vn):
                        dq, dk, dv = res[vn]
                        kind, _, lib = vn.partition("@")
                        rc = libs[lib].hopper_bwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do_c.data_ptr(),
                                           lse.data_ptr(), None, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                           ws.data_ptr(), 1, H, Hkv, S, S, D, causal, 0, 0, VARIANTS[kind], stream)
                        if rc != 0:
                            raise RuntimeError("hopper_bwd %s failed: %d" % (vn, rc))
                    fns[vn] = ours
                fns["cudnn"] = cudnn
                times = {n: [] for n in fns}
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    for fn in fns.values():
                        fn()
                        fn()
                    torch.cuda.synchronize()
                    if S == seqs[0]:
                        print("cuDNN grad_fn:", out.grad_fn.name(), "dO contiguous for ours:",
                              dot.transpose(1, 2).is_contiguous(), flush=True)
                    names = list(fns)
                    for r in range(a.rounds):
                        order = names[r % len(names):] + names[:r % len(names)]
                        for name in order:
                            ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps + 1)]
                            ev[0].record()
                            for i in range(a.reps):
                                fns[name]()
                                ev[i + 1].record()
                            ev[-1].synchronize()
                            times[name] += [ev[i].elapsed_time(ev[i + 1]) for i in range(a.reps)]
                flops = 2.5 * 4.0 * S * S * H * D * (0.5 if causal else 1.0)
                med = {n: statistics.median(t) for n, t in times.items()}
                for name in names:
                    print("ABBWD S=%d causal=%d H=%d Hkv=%d D=%d %-6s ms=%.3f (min %.3f max %.3f) TFLOPs=%.1f  x cudnn %.3f"
                          % (S, causal, H, Hkv, D, name, med[name], min(times[name]), max(times[name]),
                             flops / (med[name] * 1e-3) / 1e12, med["cudnn"] / med[name]), flush=True)
                for vn in variants:
                    summary.append((S, causal, Hkv, vn, flops / (med[vn] * 1e-3) / 1e12,
                                    flops / (med["cudnn"] * 1e-3) / 1e12, med["cudnn"] / med[vn]))
                gq, gk, gv = grads["g"]
                for vn in variants:
                    dq, dk, dv = res[vn]
                    fin = all(bool(torch.isfinite(x).all()) for x in (dq, dk, dv))
                    diff = [(x.float() - y.float()).abs().max().item() for x, y in ((dq, gq), (dk, gk), (dv, gv))]
                    print("CHECKALL S=%d causal=%d %s: all finite %s; max |ours - cudnn| dQ %.3e dK %.3e dV %.3e"
                          % (S, causal, vn, fin, *diff), flush=True)
                dq, dk, dv = res[variants[-1]]
                if a.check and S == seqs[0] and H == Hkv:
                    for h in (0, H - 1):
                        rq, rk, rv = reference_head(q, k, v, do, h, causal, scale)
                        line = []
                        ok = True
                        for nm, ours_t, cud_t, ref in (("dQ", dq, gq, rq), ("dK", dk, gk, rk), ("dV", dv, gv, rv)):
                            eo = (ours_t[0, :, h].float() - ref).abs().max().item()
                            ec = (cud_t[0, :, h].float() - ref).abs().max().item()
                            fl = (ref.to(torch.bfloat16).float() - ref).abs().max().item()
                            ok = ok and eo <= 2 * ec + fl
                            line.append("%s ours %.3e cudnn %.3e (bf16 floor %.3e)" % (nm, eo, ec, fl))
                        print("CHECKREF S=%d causal=%d head %d %s vs fp32 ref: %s %s"
                              % (S, causal, h, variants[-1], "; ".join(line), "ok" if ok else "SUSPECT"), flush=True)
                        del rq, rk, rv
                del q, k, v, do, ql, kl, vl, out, dot, grads, gq, gk, gv, o, lse, ws, res, dq, dk, dv, do_c
                torch.cuda.empty_cache()
    print("==== backward A/B summary (TFLOP/s, FLOPs = 2.5 x 4 S^2 H D, half causal)")
    for S, causal, Hkv, vn, to, tc, ratio in summary:
        print("SUMMARY S=%6d %-6s H=%d Hkv=%d D=%d  ours:%-5s %6.1f  cudnn %6.1f  ours/cudnn %.3f"
              % (S, "causal" if causal else "full", H, Hkv, D, vn, to, tc, ratio))


if __name__ == "__main__":
    main()
