"""The peer for bench/gpu_linear_bench: flash-linear-attention's chunk_simple_gla with a constant
per-head decay (g_gamma = log lambda_h = -(8/H) h/H - 0.01, as in the CEO anchor script), B = 1,
bf16, scale 1/sqrt(d) (fla's default), q, k, v and dO uniform in [-1, 1) like ours; timed the
same way (median of CUDA-event-timed iterations after warm-up). Stops at the first OOM with a
line saying so. Needs the flash-linear-attention and fla-core wheels (README: carrying them).
Usage: python3 bench/fla_linear_peer.py [--seqs 8192,...] [--heads 16] [--dim 128] [--iters 3]
Prints one JSON object per line."""
import argparse, gc, json
import torch

from peer_timing import median_seconds  # noqa: E402 (bench/ is the script's folder)

C = 64  # the chunk of the FLOP model shared with gpu_linear_bench (not fla's own)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqs", default="8192,32768,131072,524288,1048576,2097152,4194304,8388608")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--stall-report", type=float, default=240,
                    help="print every thread's stack to stderr after this many seconds (a slow Triton autotune)")
    args = ap.parse_args()
    import faulthandler, sys, time
    faulthandler.dump_traceback_later(args.stall_report, exit=False)
    start = time.time()

    def note(text):  # progress on stderr, so a stall shows where it is
        print(f"[fla peer {time.time() - start:7.1f} s] {text}", file=sys.stderr, flush=True)

    note("importing fla")
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # no wheel: say so as a JSON line
        print(json.dumps(dict(kind="fla_linear", error="import: " + repr(e)[:200])), flush=True)
        return
    H, D = args.heads, args.dim
    g_gamma = -(8.0 / H) * torch.arange(H, device="cuda", dtype=torch.float32) / H - 0.01
    for n in [int(x) for x in args.seqs.split(",")]:
        fwd_flops = 2.0 * n * H * (C * D / 2 + C * D / 2 + 2.0 * D * D)
        row_bytes = n * H * D * 2
        try:
            q, k, v = (torch.rand(1, n, H, D, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1)
                       .requires_grad_(True) for _ in range(3))
            do = torch.rand(1, n, H, D, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1)
            torch.cuda.reset_peak_memory_stats()

            def fwd():
                with torch.no_grad():
                    chunk_simple_gla(q, k, v, g_gamma=g_gamma, output_final_state=True)

            def fwd_bwd():
                o, _ = chunk_simple_gla(q, k, v, g_gamma=g_gamma, output_final_state=True)
                o.backward(do)

            note(f"N = {n}: forward")
            tf = median_seconds(fwd, args.iters, args.warmup)
            note(f"N = {n}: forward + backward")
            tfb = median_seconds(fwd_bwd, args.iters, args.warmup)
            print(json.dumps(dict(kind="fla_linear", seq=n, heads=H, dim=D, fwd_ms=tf * 1e3,
                                  fwd_tflops=fwd_flops / tf / 1e12, fwd_GBps=4 * row_bytes / tf / 1e9,
                                  fwdbwd_ms=tfb * 1e3, fwdbwd_tflops=3 * fwd_flops / tfb / 1e12,
                                  fwdbwd_GBps=11 * row_bytes / tfb / 1e9, tokens_per_s_fwdbwd=n / tfb,
                                  peak_GiB=torch.cuda.max_memory_allocated() / 2**30)), flush=True)
        except torch.OutOfMemoryError:
            print(json.dumps(dict(kind="fla_linear", seq=n, heads=H, dim=D, error="OOM")), flush=True)
            break
        except Exception as e:  # e.g. a Triton failure: report it and stop
            print(json.dumps(dict(kind="fla_linear", seq=n, heads=H, dim=D, error=repr(e)[:300])), flush=True)
            break
        finally:
            q = k = v = do = None
            gc.collect()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
