"""The PyTorch peer for seqpar's multi-GPU benchmark: PyTorch context parallel
(torch.distributed.tensor.experimental.context_parallel, its ring attention over the SDPA
backend chosen, cuDNN by default) on the GPUs of one host. Causal, bf16, B = 1, H = 32,
D = 128 (flags change H and D; --kv-heads makes it GQA: K/V are made with fewer heads and
repeated to H inside the timed step, as Hugging Face's and torchtitan's Llama do before SDPA, so
the ring carries the repeated K/V). Every input, dout included, is uniform in [-1, 1), as
bench_gpu_ring's. For each total sequence length S it times the forward alone
and forward + backward (out.backward(dout), dout random), as the median of CUDA-event-timed
iterations after one warm-up (10 iterations for S <= 65536, 3 for S <= 524288, else 1; with
--once a single run of each and no warm-up, to find the longest S quickly), and
measures the peak extra memory: torch.cuda.max_memory_allocated() minus memory_allocated()
once the inputs q, k, v (and dout) exist on the rank.

Usage:
  torchrun --standalone --nproc_per_node=N bench/torch_cp_peer.py \
      [--seqs 16384,65536,...] [--backend cudnn|flash|efficient] [--heads 32] [--kv-heads 8] [--head-dim 128] \
      [--max-seconds 400] [--inputs local|shard] [--rotate allgather|alltoall] [--once]

Rank 0 prints one JSON object per line and S:
  {"kind":"torch_cp","gpus":N,"backend":...,"seq":S,"tokens_per_gpu":S/N,"fwd_ms":...,
   "fwdbwd_ms":...,"fwdbwd_tflops_per_gpu":...,"peak_extra_GiB":...}
with FLOPs = 4*B*H*S*S*D*0.5 (causal) for the forward and 3.5 times that for forward +
backward, divided by N. An S whose estimated time (S^2 scaling from the previous S, times
its number of runs) exceeds what is left of --max-seconds is skipped ("skipped: time
budget"); all ranks follow rank 0's decision. A rank whose S fails (out of memory, mostly)
prints {"kind":"torch_cp","seq":S,"rank":r,"error":"..."} and exits at once with status 3:
its peers may be waiting for it inside a ring collective, which only the NCCL timeout would
end, and torchrun stops them when one rank exits with an error. Larger S are not tried.

--inputs local (default): each rank makes only its own S/N-token shard of q, k, v, as a
model under context parallelism would (its q, k, v come from sharded activations);
context_parallel is entered with a tiny dummy buffer only, so it patches SDPA and nothing
else. The ring does the same work: which causal blocks a rank computes depends on its rank
and the load-balanced layout, not on the data.
--inputs shard: as /work/shared/anchors/torch_anchors.py does, full-length q, k, v are made
on every rank and sharded by context_parallel(buffers=[q, k, v]); their full-size storage
stays allocated (not counted in peak_extra_GiB, but it takes memory from the run).
"""
import os

# Before torch.distributed is imported: no NVLink multicast / NVLS (see KINDS.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse
import datetime
import gc
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import median_seconds  # noqa: E402 (bench/ is the script's folder)

DEFAULT_SEQS = "16384,65536,131072,262144,524288,1048576,2097152"
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}

# Skip decisions broadcast from rank 0.
RUN, SKIP_BUDGET, SKIP_SHAPE = 0, 2, 3


def causal_flops(b, h, s, d):
    return 4.0 * b * h * s * s * d * 0.5


def iterations_for(s, once=False):
    if once:
        return 1
    return 10 if s <= 65536 else (3 if s <= 524288 else 1)


def warmups(once):
    return 0 if once else 1


def set_rotate(method):
    try:
        from torch.distributed.tensor.experimental._attention import set_rotate_method
    except ImportError:
        from torch.distributed.tensor.experimental._context_parallel._attention import set_rotate_method
    set_rotate_method(method)


def uniform(*shape):
    """bf16 uniform in [-1, 1), the distribution bench_gpu_ring feeds ours."""
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)


def run_one(args, mesh, rank, world, s):
    """Times S on this rank; returns (fwd_s, fwdbwd_s, peak_extra_bytes). Raises on failure."""
    from torch.distributed.tensor.experimental import context_parallel
    b, h, d = 1, args.heads, args.head_dim
    hkv = args.kv_heads or h
    backend = BACKENDS[args.backend]
    iters = iterations_for(s, args.once)
    torch.manual_seed(1234 + rank)
    if args.inputs == "local":
        s_local = s // world
        q = uniform(b, h, s_local, d)
        k, v = uniform(b, hkv, s_local, d), uniform(b, hkv, s_local, d)
        # context_parallel wants at least one buffer (it reads its device and length); a
        # dummy of 2N positions on the sequence dim keeps the load balancer satisfied.
        dummy = torch.zeros(1, 1, 2 * world, 1, device="cuda")
        cp_ctx = context_parallel(mesh, buffers=[dummy], buffer_seq_dims=[2], no_restore_buffers={dummy})
    else:
        q = uniform(b, h, s, d)
        k, v = uniform(b, hkv, s, d), uniform(b, hkv, s, d)
        cp_ctx = context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v})
    with cp_ctx, sdpa_kernel([backend]):
        for t in (q, k, v):
            t.requires_grad_(True)
        def attention():
            kk, vv = k, v
            if hkv != h:  # GQA: each K/V head serves h / hkv query heads (Llama's repeat_kv)
                kk, vv = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

        # dout with the output's own layout (cuDNN's backward is picky about strides).
        with torch.no_grad():
            o = attention()
            dout = torch.empty_like(o).uniform_(-1, 1)
            del o
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

        def fwd():
            attention()

        def fwd_bwd():
            attention().backward(dout)

        t_fwd = median_seconds(fwd, iters, warmups(args.once))
        t_fb = median_seconds(fwd_bwd, iters, warmups(args.once))
        peak = torch.cuda.max_memory_allocated() - base
    return t_fwd, t_fb, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default=DEFAULT_SEQS, help="total sequence lengths, comma-separated")
    ap.add_argument("--backend", default="cudnn", choices=sorted(BACKENDS))
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads, dividing --heads (0: as many as heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--max-seconds", type=float, default=400.0,
                    help="time budget for all S; an S estimated to overrun what is left is skipped")
    ap.add_argument("--inputs", default="local", choices=["local", "shard"],
                    help="local: each rank makes its own shard; shard: full q,k,v sharded by context_parallel")
    ap.add_argument("--rotate", default=None, choices=["allgather", "alltoall"],
                    help="context parallel's KV rotate method (default: PyTorch's own default)")
    ap.add_argument("--once", action="store_true",
                    help="one forward and one forward+backward per S, no warm-ups (longest-S runs)")
    ap.add_argument("--nccl-timeout", type=float, default=300.0,
                    help="seconds before a stuck collective aborts the process group")
    args = ap.parse_args()

    t_start = time.perf_counter()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.nccl_timeout))
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (world,))
    if args.rotate:
        set_rotate(args.rotate)
    seqs = [int(x) for x in args.seqs.split(",") if x.strip()]
    b, h, d = 1, args.heads, args.head_dim
    hkv = args.kv_heads or h
    if hkv <= 0 or h % hkv:
        ap.error(f"--kv-heads {args.kv_heads} must divide --heads {h}")

    def emit(obj):
        if rank == 0:
            print(json.dumps(obj), flush=True)

    emit(dict(kind="torch_cp_info", gpus=world, backend=args.backend, torch=torch.__version__,
              device=torch.cuda.get_device_name(), heads=h, kv_heads=hkv, dim=d, inputs=args.inputs,
              rotate=args.rotate or "default", max_seconds=args.max_seconds))

    prev = None  # (seq, fwd_s, fwdbwd_s) of the last S that ran
    flag = torch.zeros(1, dtype=torch.int64, device="cuda")
    for s in seqs:
        # Rank 0 decides whether to run S; everyone follows its decision.
        decision = RUN
        if rank == 0:
            if s % (2 * world) != 0:
                decision = SKIP_SHAPE
            elif prev is not None:
                ps, pf, pfb = prev
                scale = (s / ps) ** 2
                # The timed runs and warm-ups of fwd and fwd+bwd, +1 forward to shape dout.
                est = scale * ((pf + pfb) * (iterations_for(s, args.once) + warmups(args.once)) + pf)
                left = args.max_seconds - (time.perf_counter() - t_start)
                if est > left:
                    decision = SKIP_BUDGET
        flag.fill_(decision)
        dist.broadcast(flag, src=0)
        decision = int(flag.item())
        if decision == SKIP_SHAPE:
            emit(dict(kind="torch_cp", gpus=world, backend=args.backend, seq=s,
                      error=f"S must be a multiple of 2*gpus = {2 * world}"))
            continue
        if decision == SKIP_BUDGET:
            emit(dict(kind="torch_cp", gpus=world, backend=args.backend, seq=s, error="skipped: time budget"))
            continue

        if rank == 0:  # progress on stderr, with the time since the start
            print(f"[peer +{time.perf_counter() - t_start:.0f} s] seq={s}: running", file=sys.stderr, flush=True)
        try:
            result = run_one(args, mesh, rank, world, s)
        except Exception as e:  # out of memory, mostly: report it and end the job (docstring)
            err = f"{type(e).__name__}: {e}"[:300]
            print(f"[rank {rank} +{time.perf_counter() - t_start:.0f} s] seq={s}: {err}", file=sys.stderr, flush=True)
            print(json.dumps(dict(kind="torch_cp", gpus=world, backend=args.backend, seq=s, rank=rank, error=err)),
                  flush=True)
            os._exit(3)
        gc.collect()
        torch.cuda.empty_cache()

        t_fwd, t_fb, peak = result
        # The worst rank's peak memory.
        peak_t = torch.tensor([peak], dtype=torch.int64, device="cuda")
        dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
        prev = (s, t_fwd, t_fb)
        f = causal_flops(b, h, s, d)
        emit(dict(kind="torch_cp", gpus=world, backend=args.backend, seq=s, tokens_per_gpu=s // world,
                  heads=h, kv_heads=hkv, dim=d, causal=True, inputs=args.inputs, iters=iterations_for(s, args.once),
                  warmups=warmups(args.once),
                  fwd_ms=t_fwd * 1e3, fwdbwd_ms=t_fb * 1e3,
                  fwd_tflops_per_gpu=f / t_fwd / 1e12 / world,
                  fwdbwd_tflops_per_gpu=3.5 * f / t_fb / 1e12 / world,
                  peak_extra_GiB=int(peak_t.item()) / 2**30))

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
