"""Timing shared by the PyTorch peer scripts: the median of CUDA-event-timed calls."""
import torch


def median_seconds(fn, iters, warmup=1):
    """Runs fn `warmup` times, then times `iters` calls with CUDA events; returns the median."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record(); fn(); stop.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return times[len(times) // 2]
