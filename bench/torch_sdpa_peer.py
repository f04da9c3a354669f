"""The peer for bench/gpu_attention_bench: PyTorch scaled_dot_product_attention on one GPU
with its flash (FlashAttention-2) and cuDNN backends, bf16, B = 1, uniform [-1, 1) q, k, v and
dO (the bench's distribution), timed the same way (median of CUDA-event-timed iterations after
warm-up; forward alone, then forward + backward). GQA (--kv-heads) through enable_gqa; where a
backend refuses it, K/V are expanded to H heads inside the timed call ("gqa": "expanded").
Usage: python3 bench/torch_sdpa_peer.py [--seqs 8192,32768,131072] [--heads 32] [--kv-heads 8] [--dim 128]
Prints one JSON object per line."""
import argparse, json
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import median_seconds  # noqa: E402 (bench/ is the script's folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqs", default="8192,32768,131072")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads (default: --heads)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--backends", default="flash,cudnn", help="flash and/or cudnn")
    args = ap.parse_args()
    h, d = args.heads, args.dim
    hkv = args.kv_heads or h
    chosen = args.backends.split(",")
    for backend_name, backend in [("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)]:
        if backend_name.removeprefix("torch_") not in chosen:
            continue
        for s in [int(x) for x in args.seqs.split(",")]:
            for mask in args.masks.split(","):
                causal = mask == "causal"
                # Layout [B, S, H, D] seen as [B, H, S, D], as seqpar stores it.
                def uniform(heads, grad):
                    x = torch.rand(1, s, heads, d, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1).transpose(1, 2)
                    return x.requires_grad_(grad)
                q, k, v = uniform(h, True), uniform(hkv, True), uniform(hkv, True)
                dout = uniform(h, False)
                iters, warmup = (3, 2) if s > 65536 else (10, 2)
                gqa = "native" if hkv != h else "none"

                def attend():
                    if gqa == "expanded":
                        return F.scaled_dot_product_attention(q, k.repeat_interleave(h // hkv, dim=1),
                                                              v.repeat_interleave(h // hkv, dim=1), is_causal=causal)
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)
                try:
                    with sdpa_kernel([backend]):
                        try:
                            attend()
                        except RuntimeError:
                            if hkv == h:
                                raise
                            gqa = "expanded"
                        tf = median_seconds(attend, iters, warmup)
                        def fwd_bwd():
                            attend().backward(dout)
                        tfb = median_seconds(fwd_bwd, iters, warmup)
                    flops = 4.0 * s * s * h * d * (0.5 if causal else 1.0)
                    print(json.dumps(dict(kind="peer_kernel", backend=backend_name, seq=s, heads=h, kv_heads=hkv,
                                          dim=d, causal=causal, gqa=gqa, fwd_ms=tf * 1e3, fwd_tflops=flops / tf / 1e12,
                                          fwdbwd_ms=tfb * 1e3, fwdbwd_tflops=3.5 * flops / tfb / 1e12)), flush=True)
                except Exception as e:  # report, keep going
                    print(json.dumps(dict(kind="peer_kernel", backend=backend_name, seq=s, causal=causal,
                                          error=str(e)[:200])), flush=True)
                del q, k, v, dout
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
