"""Runs a test case in P gloo processes (torch.multiprocessing spawn) and collects each rank's
result: the case is a function case(rank, world, **kwargs) in an importable module, called
after torch.distributed is initialised from a file store; what it returns (JSON-able) or the
traceback it raised comes back per rank. Processes that do not finish within the timeout are
killed and reported, so a hang fails the test instead of stalling CI."""
import importlib
import json
import os
import tempfile
import traceback

DEFAULT_TIMEOUT_S = 240


def _entry(rank, world, init_file, out_dir, module, case, kwargs, env):
    os.environ.update(env)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    result = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        fn = getattr(importlib.import_module(module), case)
        result = {"ok": True, "value": fn(rank, world, **kwargs)}
    except BaseException:  # noqa: B902 - report anything, including SystemExit
        result = {"ok": False, "error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if result.get("ok"):
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    os._exit(0)  # skip teardown that could wait on a peer that failed


def run(world, module, case, timeout_s=DEFAULT_TIMEOUT_S, env=None, **kwargs):
    """Returns [result of rank r]: {"ok": True, "value": ...} or {"ok": False, "error": text},
    or {"ok": False, "error": "no result ..."} for a rank that hung or died."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        env = dict(env or {})
        env.setdefault("OMP_NUM_THREADS", "1")
        ctx = mp.start_processes(_entry, args=(world, init_file, tmp, module, case, kwargs, env), nprocs=world,
                                 join=False, start_method="spawn")
        import time
        deadline = time.monotonic() + timeout_s
        for p in ctx.processes:
            p.join(max(0.1, deadline - time.monotonic()))
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()
        out = []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    out.append(json.load(f))
            else:
                out.append({"ok": False, "error": f"no result from rank {r} within {timeout_s} s (hung or died)"})
        return out


def values(results):
    """Every rank's value, or an AssertionError with every failing rank's traceback."""
    bad = [f"rank {r}:\n{res['error']}" for r, res in enumerate(results) if not res["ok"]]
    assert not bad, "\n".join(bad)
    return [res["value"] for res in results]
