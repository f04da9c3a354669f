"""The peer for bench/gpu_lm_head_bench: Liger-Kernel's LigerFusedLinearCrossEntropyLoss (mean over
tokens, bf16 x and weight) on the same bits (--data DIR: what `bench_gpu_lm_head --dump DIR`
wrote), timed the same way (median of CUDA-event-timed calls after warm-up; fwd+bwd includes
the gradients' allocation as ours includes zeroing dW). Liger computes dx and dW inside its
forward (its backward only scales them), so its fwd+bwd is one pass over the logits and its
ms_fwd (inputs detached) is the loss alone. Variants: liger (its default: bf16 dW
accumulator), liger_fp32_accum (accum_dtype=float32, as our fp32 dW) and torch_plain (x @ w.T,
fp32 logits, F.cross_entropy). Memory: torch.cuda.max_memory_allocated above the inputs, the
returned gradients included (grad_bytes says how much of it they are). --check compares the
loss and sampled rows of dx and dW of every variant and of ours (DIR's samples) with an fp32
oracle (TF32 off). Without --data the inputs are drawn from the same distribution by torch.
Usage: python3 bench/liger_flce_peer.py --data DIR [--check] [--iters 10] [--variants ...]
Prints one JSON object per line."""
import argparse, gc, json, math, os, sys, time
import torch
import torch.nn.functional as F

from peer_timing import median_seconds  # noqa: E402 (bench/ is the script's folder)


def load_inputs(args):
    """x [T, H] bf16, w [V, H] bf16, targets [T] int64 on the GPU, and the metadata."""
    if args.data:
        meta = json.load(open(os.path.join(args.data, "meta.json")))
        T, H, V = meta["tokens"], meta["hidden"], meta["vocab"]
        read = lambda name, n, dtype: torch.from_file(os.path.join(args.data, name), size=n, dtype=dtype)
        x = read("x.bin", T * H, torch.bfloat16).view(T, H).cuda()
        w = read("w.bin", V * H, torch.bfloat16).view(V, H).cuda()
        t = read("targets.bin", T, torch.int32).cuda().long()
        return x, w, t, meta
    T, H, V = args.tokens, args.hidden, args.vocab  # same distribution, other bits
    x = ((torch.rand(T, H, device="cuda") * 2 - 1) * math.sqrt(3)).bfloat16()
    w = ((torch.rand(V, H, device="cuda") * 2 - 1) * (0.02 * math.sqrt(3))).bfloat16()
    t = torch.randint(0, V, (T,), device="cuda")
    return x, w, t, dict(tokens=T, hidden=H, vocab=V, data="torch_rand")


KINDS = dict(liger="liger_flce", liger_fp32_accum="liger_flce_fp32_accum", torch_plain="torch_plain_ce")


def make_loss(variant):
    if variant == "torch_plain":
        return lambda x, w, t: F.cross_entropy((x @ w.t()).float(), t)
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    fn = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32 if variant == "liger_fp32_accum" else None)
    return lambda x, w, t: fn(w, x, t)


def run_variant(variant, x, w, t, args, samples):
    loss_fn = make_loss(variant)
    xg, wg = x.detach().requires_grad_(True), w.detach().requires_grad_(True)  # the inputs' own memory
    out = {}

    def fwd_bwd():
        xg.grad = wg.grad = None
        loss = loss_fn(xg, wg, t)
        loss.backward()
        out["loss"] = loss.detach()

    def fwd():  # the loss alone: Liger makes its gradients in the forward whenever x requires them
        with torch.no_grad():
            loss_fn(xg.detach(), wg.detach(), t)

    fwd_bwd()  # Triton's compile and cuBLAS's workspace before the baseline
    xg.grad = wg.grad = None
    out.clear()
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd(); torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    T, H = xg.shape
    V = wg.shape[0]
    line = dict(kind=KINDS[variant], tokens=T, hidden=H, vocab=V,
                loss=out["loss"].item(), dx_l2=xg.grad.float().norm().item(), dw_l2=wg.grad.float().norm().item(),
                peak_extra_bytes=peak, grad_bytes=xg.grad.numel() * xg.grad.element_size()
                + wg.grad.numel() * wg.grad.element_size(), grad_dtype=str(wg.grad.dtype).replace("torch.", ""))
    s = args.stride
    samples[variant] = (out["loss"].item(), xg.grad[::s].float().clone(), wg.grad[::s].float().clone())
    t_fb = median_seconds(fwd_bwd, args.iters, args.warmup)
    t_f = median_seconds(fwd, args.iters, args.warmup)
    line.update(ms_fwd_bwd=t_fb * 1e3, ms_fwd=t_f * 1e3, tflops_fwd_bwd=6.0 * T * H * V / t_fb / 1e12)
    return line


def oracle(x, w, t, stride):
    """fp32 (TF32 off) loss, dx[::stride] and dW[::stride] of mean cross-entropy of x @ w.T."""
    torch.backends.cuda.matmul.allow_tf32 = False
    T, V = x.shape[0], w.shape[0]
    wf = w.float()
    lse = torch.empty(T, device="cuda")
    target_logit = torch.empty(T, device="cuda")
    for r0 in range(0, T, 2048):
        logits = x[r0:r0 + 2048].float() @ wf.t()
        lse[r0:r0 + 2048] = torch.logsumexp(logits, 1)
        target_logit[r0:r0 + 2048] = logits.gather(1, t[r0:r0 + 2048, None])[:, 0]
        del logits
    loss = (lse.double() - target_logit.double()).mean().item()
    ts, vs = torch.arange(0, T, stride, device="cuda"), torch.arange(0, V, stride, device="cuda")
    p = torch.softmax(x[ts].float() @ wf.t(), 1)
    p[torch.arange(len(ts), device="cuda"), t[ts]] -= 1
    dx = (p @ wf) / T
    del p
    pv = torch.exp(x.float() @ wf[vs].t() - lse[:, None]) - (t[:, None] == vs[None, :]).float()
    dw = (pv.t() @ x.float()) / T
    return loss, dx, dw


def errors(name, got, ref):
    (loss, dx, dw), (rloss, rdx, rdw) = got, ref
    err = lambda a, b: dict(max_rel=((a - b).abs().max() / b.abs().max()).item(),
                            rel_l2=((a - b).norm() / b.norm()).item())
    return dict(kind="lm_head_check", side=name, loss=loss, loss_abs_err=abs(loss - rloss),
                dx=err(dx, rdx), dw=err(dw, rdw))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="", help="the folder bench_gpu_lm_head --dump wrote")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--variants", default="liger,liger_fp32_accum,torch_plain")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare every side with the fp32 oracle (needs --data)")
    args = ap.parse_args()
    start = time.time()
    note = lambda text: print(f"[liger peer {time.time() - start:6.1f} s] {text}", file=sys.stderr, flush=True)
    x, w, t, meta = load_inputs(args)
    args.stride = int(meta.get("sample_stride", 64))
    try:
        import liger_kernel, importlib.metadata as md
        version = md.version("liger_kernel")
    except Exception as e:  # noqa: BLE001 (say why on a JSON line; torch_plain still runs)
        version = "import: " + repr(e)[:200]
    samples = {}
    for variant in args.variants.split(","):
        note(f"{variant}")
        try:
            line = run_variant(variant, x, w, t, args, samples)
        except torch.cuda.OutOfMemoryError:
            line = dict(kind=KINDS[variant], error="OOM")
        except Exception as e:  # noqa: BLE001 (an import or Triton failure is a result line too)
            line = dict(kind=KINDS[variant], error=repr(e)[:300])
        line.update(liger_version=version, torch=torch.__version__, data=meta.get("data", args.data),
                    device=torch.cuda.get_device_name())
        print(json.dumps(line), flush=True)
        gc.collect(); torch.cuda.empty_cache()
    if args.check and args.data:
        note("fp32 oracle")
        ref = oracle(x, w, t, args.stride)
        H = x.shape[1]
        read = lambda name: torch.from_file(os.path.join(args.data, name), size=os.path.getsize(
            os.path.join(args.data, name)) // 4, dtype=torch.float32).view(-1, H).cuda()
        samples["seqpar"] = (meta["loss"], read("dx_sample.bin"), read("dw_sample.bin"))
        lines = {name: errors(name, got, ref) for name, got in samples.items()}
        plain = lines.get("torch_plain")
        for line in lines.values():
            if plain:  # the bf16 rule: at most 2x the error of the plain same-precision head
                line["rel_l2_vs_plain"] = {g: line[g]["rel_l2"] / max(plain[g]["rel_l2"], 1e-30) for g in ("dx", "dw")}
            print(json.dumps(line), flush=True)
    note("done")


if __name__ == "__main__":
    main()
