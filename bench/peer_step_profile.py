"""The PyTorch peer's training step by kind of work, in the kinds `seqpar train --profile` reports
ours (attention, products, lm_head, norms, rope, swiglu, embedding, casts) plus the peer's own
(optimizer, communication, other), so the two steps can be laid side by side (issue 36, item 1).

Nsight Systems does not run on the GPU machines, so the step is read from PyTorch's profiler
(CUPTI): every GPU kernel and memory op of one step, each put in a kind by its name and, for the
LM head, by the shapes of the operator that launched it (any operator with the vocabulary among
its input dims: the head's products, the fp32 cast of the logits, the cross-entropy). A kind's
milliseconds are the sum of its kernels' durations; "busy" is the union of all kernel intervals
and "idle" the profiled step's wall time less it. The profiled step is an extra step: the
profiler slows the host side, so the timed steps stay the ones without it.

kernel_kind() needs no torch (tests: python/tests/test_peer_step_profile.py).
"""
import json
import os
import tempfile

KINDS = ("attention", "products", "lm_head", "norms", "rope", "swiglu", "embedding", "casts", "optimizer",
         "communication", "other")

_GEMM = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_")


def kernel_kind(name, op_dims=(), vocab=0, op_name=""):
    """The kind of one GPU kernel (or memory op), from its name, the name of the operator that
    launched it and that operator's input dims (a list of shapes)."""
    n = name.lower()
    op = op_name.lower()
    if "nccl" in n:
        return "communication"
    if any(s in n for s in ("sdpa", "fmha", "flash", "attention")):
        return "attention"
    if "embedding" in n or "embedding" in op or "indexselect" in n or "index_select" in op:
        return "embedding"
    if vocab and any(vocab in (shape or []) for shape in op_dims):
        return "lm_head"
    if any(s in n for s in ("cross_entropy", "log_softmax", "logsoftmax", "nll_loss")):
        return "lm_head"
    if "multi_tensor_apply" in n or "adam" in n or "foreach" in n:
        return "optimizer"
    if "chunk_cat" in n or "split_with_sizes" in n:  # FSDP2's all-gather copy-in / reduce-scatter copy-out
        return "communication"
    if "triton" in n:
        if "silu" in n:
            return "swiglu"
        if "rsqrt" in n:
            return "norms"
        if ("cat" in n and "neg" in n) or "_sin" in n or "_cos" in n:
            return "rope"
        return "other"
    if any(s in n for s in _GEMM):
        return "products"
    if "copy" in n or "cast" in n or "memcpy" in n:
        return "casts"
    return "other"


def busy_ms(intervals):
    """The union of [start, end) intervals (microseconds), in milliseconds."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def summarize(trace_events, vocab, wall_ms, top=15):
    """work_ms by kind, busy and idle ms, and the longest kernels by name, from a Chrome trace's events."""
    ops = {}  # External id -> (name, input dims) of the CPU operator
    for e in trace_events:
        if e.get("cat") == "cpu_op":
            args = e.get("args", {})
            if "External id" in args:
                ops[args["External id"]] = (e.get("name", ""), args.get("Input Dims", []))
    work = {k: 0.0 for k in KINDS}
    by_name, intervals = {}, []
    for e in trace_events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        dur = float(e.get("dur", 0))
        op_name, dims = ops.get(e.get("args", {}).get("External id"), ("", []))
        dims = [d for d in dims if isinstance(d, list)]
        work[kernel_kind(e.get("name", ""), dims, vocab, op_name)] += dur / 1e3
        by_name[e.get("name", "")] = by_name.get(e.get("name", ""), 0.0) + dur / 1e3
        intervals.append((float(e["ts"]), float(e["ts"]) + dur))
    busy = busy_ms(intervals)
    longest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return dict(work_ms={k: round(v, 3) for k, v in work.items()}, busy_ms=round(busy, 3),
                idle_ms=round(max(wall_ms - busy, 0.0), 3), wall_ms=round(wall_ms, 3),
                longest=[[name[:120], round(ms, 3)] for name, ms in longest])


def profile_step(run_step, vocab):
    """Runs run_step() once under PyTorch's profiler; returns summarize()'s dict."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return summarize(events, vocab, wall_ms)
