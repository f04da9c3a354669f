#!/usr/bin/env python3
"""ab_masks.py: the lab's A/B of our sm_90a kernels over MASKS (visible-tile lists, issue 34) against
PyTorch's compiled flex_attention with the same mask, and both sides' dense causal (ours, and
cuDNN SDPA), in ONE process on the SAME inputs, interleaved round by round.

Problem (as ../../../shared/anchors/flex_masks_peer.py sets the peer up): bf16, B = 1, H = 32,
D = 128, uniform [-1, 1) q, k, v and dO on both sides; masks: documents (N of random lengths, cut
points drawn uniformly, causal inside), a causal sliding window of W keys, and a BigBird block
pattern (128-token blocks: neighbours, a global first block, 3 random blocks per row). TFLOP/s
count visible scores only: forward 4 H D x visible, forward + backward 3.5 x that.

Ours: tensors [B, S, H, D] through build/libhopper_mask.so (the backend's variants: forward --fwd on
masks and --fwd-causal on dense causal, pp192 by default, the backend's being persist192 on tile
lists and persist192u (or, since session t, the cluster kernel from 16K keys) on dense causal, with
--fwd-variants timed forward-only beside them; the backward variants of --bwd-variants, each with
the lists of its own query tile: base 64 rows, q80 80); the lists are built once per mask and variant (not timed; their build time is
printed). fwd+bwd = our forward then our whole backward; bwd = our whole backward alone (after one
forward). The peer's backward alone is not timed: "flex bwd" is its fwd+bwd time minus its forward
time (each a median), labelled as derived. "routed": the backward variant whose lists the library's
backend plans for the mask (backend_plan in src/kernels/hopper/hopper_tiles.hpp: at D = 128 base's,
q80's or short64's tiles, per mask), with that variant's timings; dense causal routes to q80;
"routed_fwd" in the JSON rows: the forward it plans (persist64 on 64 x 64 tiles, else --fwd).
backend_pairs.py prints that pair's fwd+bwd per mask from the JSON rows.
"ours causal" (the 0.9x bar) is --causal-ref's dense causal fwd+bwd (q80 at D = 128, the backend's dense backward). flex: torch.compile(flex_attention) on [B, H, S, D]
copies of the same values with create_block_mask(_compile=True); fwd+bwd = forward + .backward(dO).
cuDNN: scaled_dot_product_attention(is_causal=True) under sdpa_kernel(CUDNN_ATTENTION).

At the first length every mask's O and gradients are compared with flex's over all elements.

--fwd-only (session u): forward rounds only (no backward, no fwd+bwd; flex's forward alone is compiled),
the O of --fwd and of every --fwd-variants variant compared with flex's over all elements at the first
length. Each forward variant runs on the lists of its own forward tile (hopper_mask_fwd_tile: persist64,
the short-tile forward, 64 x 64; the others the backend's 128 x 192), and each row reports per tile its
entries, boundary entries and visible / computed scores (computed = entries x tile rows x tile keys).
Masks: bigbird is bigbird128; bigbirdN draws N-token blocks.

--fb-all (session u, short64): each --fwd-variants forward followed by every --bwd-variants backward in the
fwd+bwd rounds, and a last summary per backward (its lists' entries and computed pairs, backward alone, each
pair against flex). short64 (64-key tiles, hopper_bwd_short.cuh) runs on lists planned per 64-key tile
(hopper_mask_plan_keys). --skip-causal: no dense causal rounds.

Usage: python3 ab_masks.py --lib build/libhopper_mask.so --seqs 32768 \
           [--masks docs16,docs256,window4096,window16384,bigbird] [--rounds 3] [--reps 2] \
           [--bwd-variants base,q80] [--causal-ref q80] [--fwd persist192 --fwd-causal persist192u]
           [--fwd-variants pp192,persist192u]   (add --masks docs64,window1024 etc.)
       python3 ab_masks.py --lib build/libhopper_mask.so --fwd-only --fwd persist192 --fwd-causal persist192u \
           --fwd-variants persist64 --masks docs256,docs64,bigbird,bigbird64,window1024
"""
import argparse
import ctypes
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

VP = ctypes.c_void_p
# Backward variants by name (dev/hopper_attention/variants.cuh, kBwdVariants).
BWD_VARIANTS = {"base": 0, "defer": 1, "sfirst": 3, "q128": 4, "q80": 5, "short64": 6, "q80h": 7, "baseh": 9}


def load(path):
    lib = ctypes.CDLL(path)
    lib.hopper_mask_plan.restype = VP
    lib.hopper_mask_plan.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, VP,
                                     ctypes.c_int, ctypes.c_int, VP, ctypes.c_int, VP, VP]
    lib.hopper_mask_free.argtypes = [VP]
    lib.hopper_mask_fwd.restype = ctypes.c_int
    lib.hopper_mask_fwd.argtypes = [VP, ctypes.c_int] + [VP] * 5 + [ctypes.c_int] * 5 + [VP]
    lib.hopper_mask_fwd_variant.restype = ctypes.c_int
    lib.hopper_mask_fwd_variant.argtypes = [VP, ctypes.c_int, ctypes.c_char_p] + [VP] * 5 + [ctypes.c_int] * 5 + [VP]
    lib.hopper_mask_bwd.restype = ctypes.c_int
    lib.hopper_mask_bwd.argtypes = [VP, ctypes.c_int] + [VP] * 10 + [ctypes.c_int] * 5 + [VP]
    lib.hopper_mask_plan_rows.restype = VP
    lib.hopper_mask_plan_rows.argtypes = lib.hopper_mask_plan.argtypes + [ctypes.c_int]
    lib.hopper_mask_bwd_rows.restype = ctypes.c_int
    lib.hopper_mask_bwd_rows.argtypes = [ctypes.c_int]
    lib.hopper_mask_bwd_variant.restype = ctypes.c_int
    lib.hopper_mask_bwd_variant.argtypes = [VP, ctypes.c_int] + [VP] * 10 + [ctypes.c_int] * 6 + [VP]
    lib.hopper_mask_bwd_workspace.restype = ctypes.c_size_t
    lib.hopper_mask_bwd_workspace.argtypes = [ctypes.c_int] * 4
    lib.hopper_mask_backend_tiles.restype = ctypes.c_int
    lib.hopper_mask_backend_tiles.argtypes = lib.hopper_mask_plan.argtypes[:9]
    lib.hopper_mask_plan_tiles.restype = VP
    lib.hopper_mask_plan_tiles.argtypes = lib.hopper_mask_plan.argtypes + [ctypes.c_int] * 3
    lib.hopper_mask_fwd_tile.restype = None
    lib.hopper_mask_fwd_tile.argtypes = [ctypes.c_char_p, ctypes.c_int, VP, VP]
    lib.hopper_mask_short_pays.restype = ctypes.c_int
    lib.hopper_mask_short_pays.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
    lib.hopper_mask_plan_keys.restype = VP
    lib.hopper_mask_plan_keys.argtypes = lib.hopper_mask_plan.argtypes + [ctypes.c_int] * 4
    lib.hopper_mask_bwd_keys.restype = ctypes.c_int
    lib.hopper_mask_bwd_keys.argtypes = [ctypes.c_int]
    return lib


def fwd_tile(lib, name, D):
    """(query rows, keys) of the forward tile whose lists forward variant `name` takes."""
    bm, bn = ctypes.c_int(0), ctypes.c_int(0)
    lib.hopper_mask_fwd_tile(name.encode(), D, ctypes.byref(bm), ctypes.byref(bn))
    return bm.value, bn.value


def uniform(gen, *shape):
    return (torch.rand(*shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def make_mask(name, S, rng):
    """(description for our lib, flex mask_mod, visible scores)."""
    d = dict(wl=-1, wr=-1, offsets=None, block=0, dense=None)
    if name.startswith("docs"):
        n = int(name[4:])
        cuts = sorted(rng.sample(range(1, S), n - 1))
        bounds = [0] + cuts + [S]
        d["offsets"], d["wr"] = bounds, 0
        lens = torch.tensor([bounds[i + 1] - bounds[i] for i in range(n)], device="cuda")
        doc = torch.repeat_interleave(torch.arange(n, device="cuda", dtype=torch.int32), lens)
        vis = sum(l * (l + 1) / 2 for l in lens.tolist())

        def mm(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)
    elif name.startswith("window"):
        w = int(name[6:])
        d["wl"], d["wr"] = w, 0
        vis = sum(min(i, w) + 1 for i in range(S))

        def mm(b, h, qi, ki):
            return (ki <= qi) & (qi - ki <= w)
    elif name.startswith("bigbird"):
        B = int(name[7:]) if name[7:] else 128
        nb = S // B
        pat = torch.zeros(nb, nb, dtype=torch.bool)
        for qb in range(nb):
            for kb in (qb - 1, qb, qb + 1):
                if 0 <= kb < nb:
                    pat[qb, kb] = True
            pat[qb, 0] = True
            for kb in rng.sample(range(nb), 3):
                pat[qb, kb] = True
        pat[0, :] = True
        d["block"], d["dense"] = B, pat.to(torch.uint8).contiguous()
        vis = float(pat.sum().item()) * B * B
        patd = pat.cuda()

        def mm(b, h, qi, ki):
            return patd[qi // B, ki // B]
    else:
        raise ValueError(name)
    return d, mm, vis


def mask_args(d, S, D):
    """The mask's leading arguments of hopper_mask_plan_rows and hopper_mask_backend_tiles."""
    offs = None
    if d["offsets"] is not None:
        offs = (ctypes.c_longlong * len(d["offsets"]))(*d["offsets"])
    dense = d["dense"]
    return (S, D, d["wl"], d["wr"], ctypes.cast(offs, VP) if offs else None, len(d["offsets"]) if offs else 0,
            d["block"], dense.data_ptr() if dense is not None else None, dense.shape[0] if dense is not None else 0)


def plan(lib, d, S, D, rows, tile=None, keys=128):
    """tile: the forward's (query rows, keys); None: the backend's (hopper_mask_plan_rows). keys: the
    backward's keys per tile (64: short64's lists, through hopper_mask_plan_keys)."""
    vis = ctypes.c_double(0)
    stats = (ctypes.c_longlong * 4)()
    t = time.perf_counter()
    if keys != 128:
        tl = tile or ((128, 192) if D == 128 else (192, 128))
        p = lib.hopper_mask_plan_keys(*mask_args(d, S, D), ctypes.byref(vis), stats, rows, tl[0], tl[1], keys)
    elif tile is None:
        p = lib.hopper_mask_plan_rows(*mask_args(d, S, D), ctypes.byref(vis), stats, rows)
    else:
        p = lib.hopper_mask_plan_tiles(*mask_args(d, S, D), ctypes.byref(vis), stats, rows, tile[0], tile[1])
    return p, vis.value, list(stats), time.perf_counter() - t


def time_interleaved(contenders, rounds, reps):
    """contenders: name -> callable. Median ms per call over rounds x reps intervals, rotating order."""
    names = list(contenders)
    out = {n: [] for n in names}
    for f in contenders.values():
        f()
    torch.cuda.synchronize()
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
            ev[0].record()
            for i in range(reps):
                contenders[n]()
                ev[i + 1].record()
            torch.cuda.synchronize()
            out[n] += [ev[i].elapsed_time(ev[i + 1]) for i in range(reps)]
    return {n: statistics.median(v) for n, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--seqs", default="32768")
    ap.add_argument("--masks", default="docs16,docs256,window4096,window16384,bigbird")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--bwd-variants", default="base,q80")
    ap.add_argument("--causal-ref", default="q80")
    ap.add_argument("--fwd", default="pp192", help="our forward in every mask's fwd and fwd+bwd (pp192: as before; "
                    "the backend runs persist192 on tile lists)")
    ap.add_argument("--fwd-causal", default=None, help="our forward for dense causal (default --fwd; the backend "
                    "runs persist192u)")
    ap.add_argument("--fwd-variants", default="", help="more forward variants, timed forward-only in the same rounds")
    ap.add_argument("--fwd-only", action="store_true", help="forward rounds only (see the top of the file)")
    ap.add_argument("--fb-all", action="store_true", help="each --fwd-variants forward followed by EVERY backward "
                    "variant (not only the routed one) in the fwd+bwd rounds, and a per-backward summary (session u)")
    ap.add_argument("--skip-causal", action="store_true", help="no dense causal rounds (the 'vs causal' columns are nan)")
    a = ap.parse_args()
    vnames = a.bwd_variants.split(",")
    if a.fwd_only:
        return main_fwd_only(a)
    fwd_causal = a.fwd_causal or a.fwd
    fwd_more = [x for x in a.fwd_variants.split(",") if x]
    if a.causal_ref not in vnames:
        vnames.append(a.causal_ref)
    lib = load(a.lib)
    if fwd_tile(lib, a.fwd, a.dim) != ((128, 192) if a.dim == 128 else (192, 128)):
        raise SystemExit("--fwd %s takes lists of another tile: give it in --fwd-variants, or use --fwd-only" % a.fwd)
    torch._dynamo.config.cache_size_limit = 64
    flex = torch.compile(flex_attention, dynamic=False)
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0), flush=True)
    H, Hkv, D = a.heads, a.kv_heads, a.dim
    stream = VP(torch.cuda.current_stream().cuda_stream)
    summary, fb_rows = [], []
    for si, S in enumerate(int(x) for x in a.seqs.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(S)
        q, do = uniform(gen, 1, S, H, D), uniform(gen, 1, S, H, D)
        k, v = uniform(gen, 1, S, Hkv, D), uniform(gen, 1, S, Hkv, D)
        o, dq = torch.empty_like(q), torch.empty_like(q)
        dk, dv = torch.empty_like(k), torch.empty_like(k)
        lse = torch.empty(1, H, S, device="cuda", dtype=torch.float32)
        ws = torch.empty(lib.hopper_mask_bwd_workspace(1, H, S, D), device="cuda", dtype=torch.uint8)
        # The peer's tensors: [B, H, S, D] copies of the same values (K/V heads repeated for GQA).
        qt = q.transpose(1, 2).contiguous().requires_grad_()
        kt = k.transpose(1, 2).repeat_interleave(H // Hkv, 1).contiguous().requires_grad_()
        vt = v.transpose(1, 2).repeat_interleave(H // Hkv, 1).contiguous().requires_grad_()
        dot = do.transpose(1, 2).contiguous()

        def ours_fwd(p, causal=0, name=None):
            fv = (name or (fwd_causal if causal else a.fwd)).encode()

            def run():
                rc = lib.hopper_mask_fwd_variant(p, causal, fv, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                 lse.data_ptr(), 1, H, Hkv, S, D, stream)
                if rc:
                    raise RuntimeError("hopper_mask_fwd_variant %s: error %d" % (fv, rc))
            return run

        def ours_bwd(p, vn, causal=0):
            def run():
                rc = lib.hopper_mask_bwd_variant(p, causal, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                 do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                                 dv.data_ptr(), ws.data_ptr(), 1, H, Hkv, S, D, BWD_VARIANTS[vn],
                                                 stream)
                if rc:
                    raise RuntimeError("hopper_mask_bwd_variant %s: error %d" % (vn, rc))
            return run

        def ours_fb(pf, pb, vn, causal=0, fname=None):
            f, g = ours_fwd(pf, causal, fname), ours_bwd(pb, vn, causal)

            def run():
                f()
                g()
            return run

        def peer_fb(fn):
            def run():
                out = fn()
                out.backward(dot)
                qt.grad = kt.grad = vt.grad = None
            return run

        def peer_fwd(fn):
            def run():
                with torch.no_grad():
                    fn()
            return run

        def tflops(name, ms):
            mult = 3.5 if name.endswith("_fb") or "_fb_" in name else 2.5 if "_bwd" in name else 1.0
            return mult * 4 * vis * H * D / ms / 1e9

        # Dense causal, both sides.
        cud = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if a.skip_causal:
                t = {}
            else:
                fw = {"ours_causal_fwd": ours_fwd(None, 1), "cudnn_causal_fwd": peer_fwd(cud)}
                fw.update({"ours_causal_fwd_" + fv: ours_fwd(None, 1, fv) for fv in fwd_more})
                t = time_interleaved(fw, a.rounds, a.reps)
                fb = {"ours_causal_fb_" + vn: ours_fb(None, None, vn, 1) for vn in vnames}
                fb["cudnn_causal_fb"] = peer_fb(cud)
                t.update(time_interleaved(fb, a.rounds, a.reps))
                ours_fwd(None, 1)()
                t.update(time_interleaved({"ours_causal_bwd_" + vn: ours_bwd(None, vn, 1) for vn in vnames},
                                          a.rounds, a.reps))
        vis = S * (S + 1) / 2
        dense = {}
        nan = float("nan")
        if a.skip_causal:
            t = {"ours_causal_fwd": nan, "cudnn_causal_fwd": nan, "cudnn_causal_fb": nan}
            t.update({"ours_causal_fwd_" + fv: nan for fv in fwd_more})
            t.update({"ours_causal_%s_%s" % (x, vn): nan for vn in vnames for x in ("fb", "bwd")})
        for n, ms in t.items():
            dense[n] = tflops(n, ms)
            print(json.dumps(dict(kind=n, seq=S, ms=round(ms, 4), tflops=round(dense[n], 1))), flush=True)
        dense["cudnn_causal_bwd_derived"] = 2.5 * 4 * vis * H * D / max(t["cudnn_causal_fb"] - t["cudnn_causal_fwd"], 1e-9) / 1e9
        ref_fb = dense["ours_causal_fb_" + a.causal_ref]
        row = dict(mask="causal", seq=S, peer="cudnn", ours_fwd_tflops=dense["ours_causal_fwd"],
                   **{"fwd_%s_tflops" % fv: dense["ours_causal_fwd_" + fv] for fv in fwd_more},
                   peer_fwd_tflops=dense["cudnn_causal_fwd"], peer_fb_tflops=dense["cudnn_causal_fb"],
                   peer_bwd_derived_tflops=dense["cudnn_causal_bwd_derived"])
        for vn in vnames:
            row["ours_fb_%s_tflops" % vn] = dense["ours_causal_fb_" + vn]
            row["ours_bwd_%s_tflops" % vn] = dense["ours_causal_bwd_" + vn]
        print(json.dumps({kk: (round(vv, 1) if isinstance(vv, float) else vv) for kk, vv in row.items()}), flush=True)
        dense_row = row
        rng = random.Random(S)
        for name in a.masks.split(","):
            d, mm, vis = make_mask(name, S, rng)
            plans, rows_of, key_of = {}, {}, {}
            for vn in vnames:
                r = lib.hopper_mask_bwd_rows(BWD_VARIANTS[vn])
                kt_ = lib.hopper_mask_bwd_keys(BWD_VARIANTS[vn])
                if (r, kt_) not in plans:
                    plans[(r, kt_)] = plan(lib, d, S, D, r, None, kt_)
                rows_of[vn], key_of[vn] = r, (r, kt_)
            t0 = time.perf_counter()
            routed_tiles = lib.hopper_mask_backend_tiles(*mask_args(d, S, D))
            backend_plan_s = time.perf_counter() - t0
            routed_rows = routed_tiles // 1000 % 1000
            routed = next((vn for vn in vnames if key_of[vn] == (routed_rows, routed_tiles % 1000)), None)
            # The backend's forward: persist64 on lists of 64-row tiles (short_tiles_pay), else --fwd.
            routed_fwd = "persist64" if routed_tiles // 1000000 == 64 and "persist64" in fwd_more else a.fwd
            pf = next(iter(plans.values()))[0]  # the forward's lists are the same in every plan
            # Forward variants with lists of another tile (persist64) get their own plan.
            default_tile = (128, 192) if D == 128 else (192, 128)
            extra = {}
            for fv in fwd_more:
                tl = fwd_tile(lib, fv, D)
                if tl != default_tile and tl not in extra:
                    extra[tl] = plan(lib, d, S, D, 64, tl)
            pf_of = {fv: extra[fwd_tile(lib, fv, D)][0] if fwd_tile(lib, fv, D) in extra else pf for fv in fwd_more}
            vis_ours = next(iter(plans.values()))[1]
            t0 = time.perf_counter()
            bm = create_block_mask(mm, 1, 1, S, S, device="cuda", _compile=True)
            fx = lambda: flex(qt, kt, vt, block_mask=bm)
            peer_fb(fx)()  # compile both passes before timing
            t_compile = time.perf_counter() - t0
            if si == 0:  # full-size comparison with flex, every variant
                ref = fx()
                ref.backward(dot)
                torch.cuda.synchronize()
                gq, gk, gv = qt.grad, kt.grad, vt.grad
                qt.grad = kt.grad = vt.grad = None
                diff = lambda x, y: (x.float() - y.float()).abs().max().item()
                for vn in vnames:
                    dq.fill_(float("nan")), dk.fill_(float("nan")), dv.fill_(float("nan"))
                    ours_fb(pf, plans[key_of[vn]][0], vn)()
                    torch.cuda.synchronize()
                    cmp = dict(o=diff(o, ref.transpose(1, 2)), dq=diff(dq, gq.transpose(1, 2)),
                               dq_max=gq.float().abs().max().item())
                    if Hkv == H:
                        cmp.update(dk=diff(dk, gk.transpose(1, 2)), dv=diff(dv, gv.transpose(1, 2)))
                    finite = all(torch.isfinite(x).all().item() for x in (o, dq, dk, dv))
                    print(json.dumps(dict(kind="check_vs_flex", mask=name, seq=S, variant=vn, finite=finite,
                                          **{kk: float("%.3g" % vv) for kk, vv in cmp.items()})), flush=True)
                del ref, gq, gk, gv
            fw = {"ours_fwd": ours_fwd(pf), "flex_fwd": peer_fwd(fx)}
            fw.update({"ours_fwd_" + fv: ours_fwd(pf_of[fv], 0, fv) for fv in fwd_more})
            t = time_interleaved(fw, a.rounds, a.reps)
            fb = {"ours_fb_" + vn: ours_fb(pf, plans[key_of[vn]][0], vn) for vn in vnames}
            # Each extra forward on its own lists, then the backward the backend routes: the pair
            # the backend runs where that forward is its choice (session u: persist64).
            bwd_routed = routed or vnames[0]
            for fv in fwd_more:
                for vn in (vnames if a.fb_all else [bwd_routed]):
                    fb["ours_fb_%s_%s" % (fv, vn)] = ours_fb(pf_of[fv], plans[key_of[vn]][0], vn, fname=fv)
            fb["flex_fb"] = peer_fb(fx)
            t.update(time_interleaved(fb, a.rounds, a.reps))
            ours_fwd(pf)()
            t.update(time_interleaved({"ours_bwd_" + vn: ours_bwd(plans[key_of[vn]][0], vn) for vn in vnames},
                                      a.rounds, a.reps))
            row = dict(mask=name, seq=S, visible=vis, visible_ours=vis_ours, routed_rows=routed_rows, routed=routed,
                       routed_fwd=routed_fwd,
                       backend_plan_s=round(backend_plan_s, 3), plan_s=round(sum(x[3] for x in plans.values()), 3),
                       flex_compile_s=round(t_compile, 1))
            for r, x in plans.items():
                row["tiles_%d" % r[0] if r[1] == 128 else "tiles_%dx%d" % r] = dict(
                    fwd=x[2][0], fwd_boundary=x[2][1], bwd=x[2][2], bwd_boundary=x[2][3])
            for n, ms in t.items():
                row[n + "_ms"] = round(ms, 4)
                row[n + "_tflops"] = round(tflops(n, ms), 1)
            row["flex_bwd_derived_tflops"] = round(2.5 * 4 * vis * H * D / max(t["flex_fb"] - t["flex_fwd"], 1e-9) / 1e9, 1)
            print(json.dumps(row), flush=True)
            if a.fb_all:
                fb_rows.append(dict(row, bwd_tiles={vn: (key_of[vn], plans[key_of[vn]][2][2], plans[key_of[vn]][2][3])
                                                    for vn in vnames}))
            summary.append(dict(mask=name, seq=S, ours_fwd_tflops=row["ours_fwd_tflops"],
                                **{"fwd_%s_tflops" % fv: row["ours_fwd_%s_tflops" % fv] for fv in fwd_more},
                                peer_fwd_tflops=row["flex_fwd_tflops"], peer_fb_tflops=row["flex_fb_tflops"],
                                peer_bwd_derived_tflops=row["flex_bwd_derived_tflops"], ref_fb=ref_fb, routed=routed,
                                routed_fwd=routed_fwd, **{k_: v_ for k_, v_ in row.items() if k_.startswith("ours_fb_")},
                                **{"ours_bwd_%s_tflops" % vn: row["ours_bwd_%s_tflops" % vn] for vn in vnames}))
            for x in list(plans.values()) + list(extra.values()):
                lib.hopper_mask_free(x[0])
            del bm
        dense_row["ref_fb"] = ref_fb
        dense_row["routed"] = a.causal_ref
        summary.append(dense_row)
        del q, k, v, do, o, dq, dk, dv, qt, kt, vt, dot, ws
        torch.cuda.empty_cache()
    print("\nSUMMARY (TFLOP/s of visible scores; peer = flex, or cuDNN for causal; peer bwd = its fwd+bwd"
          " minus its fwd; 'vs causal' = fwd+bwd over our dense causal fwd+bwd with %s; our forward: %s on masks,"
          " %s on dense causal)" % (a.causal_ref, a.fwd, fwd_causal))
    if fwd_more:
        print("| S | mask | fwd %s | %s | peer fwd |" % (a.fwd, " | ".join("fwd " + fv for fv in fwd_more)))
        print("|" + " --- |" * (4 + len(fwd_more)))
        for r in summary:
            print("| %d | %s | %.0f | %s | %.0f |" % (r["seq"], r["mask"], r["ours_fwd_tflops"],
                                                   " | ".join("%.0f" % r["fwd_%s_tflops" % fv] for fv in fwd_more),
                                                   r["peer_fwd_tflops"]))
        print()
    head = "| S | mask | ours fwd | peer fwd | fwd ratio |"
    for vn in vnames:
        head += " fwd+bwd %s |" % vn
    head += " peer fwd+bwd |"
    for vn in vnames:
        head += " %s / peer |" % vn
    for vn in vnames:
        head += " bwd %s |" % vn
    head += " peer bwd (derived) |"
    if "base" in vnames and len(vnames) > 1:
        head += " fwd+bwd vs base | bwd vs base |"
    for vn in vnames:
        head += " %s vs causal |" % vn
    head += " routed | routed / peer | routed vs causal |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    other = [vn for vn in vnames if vn != "base"]

    def ratio(x, y):
        return x / y if y else float("nan")
    for r in summary:
        line = "| %d | %s | %.0f | %.0f | %.2fx |" % (r["seq"], r["mask"] + (" (cuDNN)" if r.get("peer") else ""),
                                                       r["ours_fwd_tflops"], r["peer_fwd_tflops"],
                                                       ratio(r["ours_fwd_tflops"], r["peer_fwd_tflops"]))
        for vn in vnames:
            line += " %.0f |" % r["ours_fb_%s_tflops" % vn]
        line += " %.0f |" % r["peer_fb_tflops"]
        for vn in vnames:
            line += " %.2fx |" % ratio(r["ours_fb_%s_tflops" % vn], r["peer_fb_tflops"])
        for vn in vnames:
            line += " %.0f |" % r["ours_bwd_%s_tflops" % vn]
        line += " %.0f |" % r["peer_bwd_derived_tflops"]
        if "base" in vnames and other:
            vn = other[-1]
            line += " %.3f | %.3f |" % (ratio(r["ours_fb_%s_tflops" % vn], r["ours_fb_base_tflops"]),
                                        ratio(r["ours_bwd_%s_tflops" % vn], r["ours_bwd_base_tflops"]))
        for vn in vnames:
            line += " %.2f |" % ratio(r["ours_fb_%s_tflops" % vn], r["ref_fb"])
        rv = r.get("routed")
        if rv in vnames:
            line += " %s | %.2fx | %.2f |" % (rv, ratio(r["ours_fb_%s_tflops" % rv], r["peer_fb_tflops"]),
                                             ratio(r["ours_fb_%s_tflops" % rv], r["ref_fb"]))
        else:
            line += " %s | | |" % rv
        print(line)
    if fb_rows:
        print_fb_all(fb_rows, vnames, fwd_more)


def print_fb_all(rows, vnames, fwd_more):
    """--fb-all's summary: per mask, each backward's lists (entries (boundary) per head; computed query x
    key pairs = entries x query rows x keys, over the first variant's), its backward alone, and each
    --fwd-variants forward followed by it, against flex (fwd+bwd, and its derived backward)."""
    v0 = vnames[0]
    print("\nSUMMARY per backward (TFLOP/s of visible scores; fwd+bwd = FWD + that backward; flex bwd derived)")
    head = "| S | mask |" + "".join(" %s tiles (bnd) | %s computed / %s |" % (vn, vn, v0) for vn in vnames[1:])
    head = "| S | mask | %s tiles (bnd) |" % v0 + head[len("| S | mask |"):]
    head += "".join(" bwd %s |" % vn for vn in vnames) + " flex bwd |"
    head += "".join(" bwd %s / %s |" % (vn, v0) for vn in vnames[1:])
    pairs = [(fv, vn) for fv in fwd_more for vn in vnames]
    head += "".join(" fwd+bwd %s+%s |" % p for p in pairs) + " flex fwd+bwd |"
    head += "".join(" %s+%s / flex |" % p for p in pairs)
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for r in rows:
        bt = r["bwd_tiles"]
        comp = lambda vn: bt[vn][1] * bt[vn][0][0] * bt[vn][0][1]
        line = "| %d | %s | %d (%d) |" % (r["seq"], r["mask"], bt[v0][1], bt[v0][2])
        line += "".join(" %d (%d) | %.3f |" % (bt[vn][1], bt[vn][2], comp(vn) / max(comp(v0), 1)) for vn in vnames[1:])
        line += "".join(" %.1f |" % r["ours_bwd_%s_tflops" % vn] for vn in vnames) + " %.1f |" % r["flex_bwd_derived_tflops"]
        line += "".join(" %.3f |" % (r["ours_bwd_%s_tflops" % vn] / r["ours_bwd_%s_tflops" % v0]) for vn in vnames[1:])
        line += "".join(" %.1f |" % r.get("ours_fb_%s_%s_tflops" % p, float("nan")) for p in pairs)
        line += " %.1f |" % r["flex_fb_tflops"]
        line += "".join(" %.2fx |" % (r.get("ours_fb_%s_%s_tflops" % p, float("nan")) / r["flex_fb_tflops"]) for p in pairs)
        print(line)


def main_fwd_only(a):
    """--fwd-only: the forwards alone (see the top of the file)."""
    fnames = [a.fwd] + [x for x in a.fwd_variants.split(",") if x and x != a.fwd]
    fwd_causal = a.fwd_causal or a.fwd
    lib = load(a.lib)
    torch._dynamo.config.cache_size_limit = 64
    flex = torch.compile(flex_attention, dynamic=False)
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0), flush=True)
    H, Hkv, D = a.heads, a.kv_heads, a.dim
    stream = VP(torch.cuda.current_stream().cuda_stream)
    tiles = {fv: fwd_tile(lib, fv, D) for fv in fnames}
    print(json.dumps(dict(kind="fwd_tiles", **{fv: "%dx%d" % tiles[fv] for fv in fnames})), flush=True)
    summary = []
    for si, S in enumerate(int(x) for x in a.seqs.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(S)
        q, do = uniform(gen, 1, S, H, D), uniform(gen, 1, S, H, D)  # dO drawn as main() does: the same q, k, v
        k, v = uniform(gen, 1, S, Hkv, D), uniform(gen, 1, S, Hkv, D)
        del do
        o = torch.empty_like(q)
        lse = torch.empty(1, H, S, device="cuda", dtype=torch.float32)
        qt = q.transpose(1, 2).contiguous()
        kt = k.transpose(1, 2).repeat_interleave(H // Hkv, 1).contiguous()
        vt = v.transpose(1, 2).repeat_interleave(H // Hkv, 1).contiguous()

        def ours(p, causal, name):
            fv = name.encode()

            def run():
                rc = lib.hopper_mask_fwd_variant(p, causal, fv, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                 lse.data_ptr(), 1, H, Hkv, S, D, stream)
                if rc:
                    raise RuntimeError("hopper_mask_fwd_variant %s: error %d" % (fv, rc))
            return run

        def peer(fn):
            def run():
                with torch.no_grad():
                    fn()
            return run

        def tf(ms, vis):
            return 4 * vis * H * D / ms / 1e9

        cud = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            fw = {"cudnn": peer(cud), fwd_causal: ours(None, 1, fwd_causal)}
            fw.update({fv: ours(None, 1, fv) for fv in fnames[1:] if fv != fwd_causal})
            t = time_interleaved(fw, a.rounds, a.reps)
        vis = S * (S + 1) / 2
        row = dict(mask="causal", seq=S, heads=H, kv_heads=Hkv, dense_causal=fwd_causal,
                   **{n + "_ms": round(ms, 4) for n, ms in t.items()},
                   **{n + "_tflops": round(tf(ms, vis), 1) for n, ms in t.items()})
        print(json.dumps(row), flush=True)
        summary.append(row)
        rng = random.Random(S)
        for name in a.masks.split(","):
            d, mm, vis = make_mask(name, S, rng)
            plans = {}
            for fv in fnames:
                if tiles[fv] not in plans:
                    plans[tiles[fv]] = plan(lib, d, S, D, 64, tiles[fv])
            t0 = time.perf_counter()
            bm = create_block_mask(mm, 1, 1, S, S, device="cuda", _compile=True)
            fx = lambda: flex(qt, kt, vt, block_mask=bm)
            peer(fx)()  # compile before timing
            t_compile = time.perf_counter() - t0
            if si == 0:  # full-size comparison with flex's O, every variant
                with torch.no_grad():
                    ref = fx()
                torch.cuda.synchronize()
                for fv in fnames:
                    o.fill_(float("nan"))
                    ours(plans[tiles[fv]][0], 0, fv)()
                    torch.cuda.synchronize()
                    err = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
                    print(json.dumps(dict(kind="check_vs_flex", mask=name, seq=S, variant=fv,
                                          finite=bool(torch.isfinite(o).all().item()), o=float("%.3g" % err))),
                          flush=True)
                del ref
            fw = {"flex": peer(fx)}
            fw.update({fv: ours(plans[tiles[fv]][0], 0, fv) for fv in fnames})
            t = time_interleaved(fw, a.rounds, a.reps)
            row = dict(mask=name, seq=S, heads=H, kv_heads=Hkv, visible=vis, visible_ours=next(iter(plans.values()))[1],
                       flex_compile_s=round(t_compile, 1))
            for tl, x in plans.items():
                row["tiles_%dx%d" % tl] = dict(entries=x[2][0], boundary=x[2][1],
                                              vis_per_computed=round(vis / max(x[2][0] * tl[0] * tl[1], 1), 3),
                                              plan_s=round(x[3], 3))
            for n, ms in t.items():
                row[n + "_ms"] = round(ms, 4)
                row[n + "_tflops"] = round(tf(ms, vis), 1)
            if (128, 192) in plans and (64, 64) in plans:  # the backend's choice (short_tiles_pay, session u)
                e_tall, e_short = plans[(128, 192)][2][0], plans[(64, 64)][2][0]
                row["computed_64_over_192"] = round(e_short * 64 * 64 / max(e_tall * 128 * 192, 1), 3)
                row["rule"] = "64x64" if lib.hopper_mask_short_pays(e_tall, e_short) else "128x192"
            print(json.dumps(row), flush=True)
            summary.append(row)
            for x in plans.values():
                lib.hopper_mask_free(x[0])
            del bm
        del q, k, v, o, lse, qt, kt, vt
        torch.cuda.empty_cache()
    base, rest = fnames[0], fnames[1:]
    print("\nSUMMARY (forward only; TFLOP/s of visible scores; H:H_kv %d:%d, D %d; tiles: entries per head, "
          "visible / computed; peer = flex on masks, cuDNN SDPA on dense causal, where ours is %s for %s)"
          % (H, Hkv, D, fwd_causal, base))
    head = "| S | mask | %s tiles |" % base + "".join(" %s tiles |" % fv for fv in rest)
    head += " %s |" % base + "".join(" %s |" % fv for fv in rest) + " peer |"
    head += "".join(" %s / %s |" % (fv, base) for fv in rest)
    head += " %s / peer |" % base + "".join(" %s / peer |" % fv for fv in rest)
    head += " computed 64x64 / 128x192 | rule (short_tiles_pay) | routed / %s | routed / peer |" % base
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for r in summary:
        causal = r["mask"] == "causal"
        tl = lambda fv: "" if causal else "%d, %.2f" % (r["tiles_%dx%d" % tiles[fv]]["entries"],
                                                        r["tiles_%dx%d" % tiles[fv]]["vis_per_computed"])
        val = lambda fv: r.get((fwd_causal if causal and fv == base else fv) + "_tflops", float("nan"))
        peer_v = r["cudnn_tflops" if causal else "flex_tflops"]
        line = "| %d | %s |" % (r["seq"], r["mask"] + (" (dense)" if causal else ""))
        line += "".join(" %s |" % tl(fv) for fv in fnames)
        line += "".join(" %.0f |" % val(fv) for fv in fnames) + " %.0f |" % peer_v
        line += "".join(" %.3f |" % (val(fv) / val(base)) for fv in rest)
        line += "".join(" %.2fx |" % (val(fv) / peer_v) for fv in fnames)
        if "rule" in r:
            pick = next((fv for fv in fnames if "%dx%d" % tiles[fv] == r["rule"]), base)
            line += " %.3f | %s | %.3f | %.2fx |" % (r["computed_64_over_192"], pick, val(pick) / val(base),
                                                   val(pick) / peer_v)
        else:
            line += " | | | |"
        print(line)


if __name__ == "__main__":
    main()
