"""seqpar.torch and seqpar.hf on one GPU (run by scripts/torch_gpu_check.sh): four checks, each
printing PASS or FAIL with its figures, and a JSON line per result.

  sdpa      seqpar.torch.attention forward and backward (thread ranks sharing the GPU, and a
            world-size-1 torch.distributed NCCL group) against PyTorch's SDPA on cuDNN, under
            the bf16 rule: max|ours - fp64| <= 2 max|SDPA bf16 - fp64| + max|round(fp64) - fp64|
            for o, dq, dk, dv.
  docs      packed documents given as cu_seqlens (thread ranks, and the world-size-1 group)
            against SDPA run on each document alone, under the same rule.
  compile   torch._dynamo.explain finds no graph break in a module calling seqpar.torch, and
            torch.compile(fullgraph=True) runs it and agrees with eager.
  hf        LlamaForCausalLM (small, random) with attn_implementation="seqpar" (thread ranks, and
            the group with shard_batch) against "sdpa": loss and every gradient under the bf16
            rule against the float32 model.
  multi     (under torchrun, one GPU per process; not in the default list) each rank's shard
            over the NCCL communicator bootstrapped from the group's store, under the bf16 rule.
  overhead  fwd+bwd time of one attention call through seqpar.hf's attention function (as
            transformers calls it: [B, H, S, D] views, autograd) over calling the C++ API through
            the binding directly on the same rank and buffers; median of interleaved steps.

Usage: python3 bench/torch_gpu_check.py [--checks sdpa,docs,compile,hf,overhead] [--jsonl FILE]
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import seqpar.hf
import seqpar.torch as st
from seqpar import _core, torch_ranks

DEV = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
BF16 = torch.bfloat16
_jsonl = None


def emit(record):
    line = json.dumps(record)
    print(line, flush=True)
    if _jsonl:
        _jsonl.write(line + "\n")
        _jsonl.flush()


def report(check, ok, **figures):
    emit({"check": check, "result": "PASS" if ok else "FAIL", **figures})
    return ok


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize(DEV)


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item()


def bf16_rule(ours, plain, oracle):
    """(ok, err, bound) of the bf16 rule for one tensor."""
    err, plain_err = max_abs(ours, oracle), max_abs(plain, oracle)
    floor = max_abs(oracle.to(BF16), oracle)
    bound = 2 * plain_err + floor
    return err <= bound, err, bound


def plain_sdpa():
    """PyTorch's fastest bf16 SDPA: cuDNN first, flash where cuDNN refuses (e.g. GQA)."""
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # an older torch without priorities
        return sdpa_kernel(order)


def sdpa_bshd(q, k, v, causal, window_left=-1):
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = None
    if window_left >= 0:
        S = q.shape[1]
        i = torch.arange(S, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        mask = (j <= i) & (j >= i - window_left)
        causal = False
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal, enable_gqa=True).transpose(1, 2)


def case_inputs(S, H, Hkv, D, seed):
    """q, k, v, dout (bf16, normal), the same on every rank."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    shapes = ((1, S, H, D), (1, S, Hkv, D), (1, S, Hkv, D), (1, S, H, D))
    return [torch.randn(*shape, device=DEV, generator=g).to(BF16) for shape in shapes]


def reference(q, k, v, dout, who, causal, left):
    """(o, dq, dk, dv) of the fp64 oracle (math) or plain bf16 SDPA on the whole sequence."""
    dtype = torch.float64 if who == "oracle" else BF16
    qq, kk, vv = (t.to(dtype).requires_grad_() for t in (q, k, v))
    if who == "plain" and left < 0:
        with plain_sdpa():
            o = sdpa_bshd(qq, kk, vv, causal)
    else:  # the oracle, and plain bf16 with a window mask (cuDNN takes no mask here)
        with sdpa_kernel(SDPBackend.MATH if who == "oracle" else SDPBackend.EFFICIENT_ATTENTION):
            o = sdpa_bshd(qq, kk, vv, causal, left)
    grads = torch.autograd.grad(o, (qq, kk, vv), dout.to(dtype))
    return (o.detach(),) + tuple(t.detach() for t in grads)


def reference_docs(q, k, v, dout, who, causal, offsets):
    """(o, dq, dk, dv) of the fp64 oracle or plain bf16 SDPA run on each document alone."""
    dtype = torch.float64 if who == "oracle" else BF16
    qq, kk, vv = (t.to(dtype).requires_grad_() for t in (q, k, v))
    parts = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        if who == "oracle":
            with sdpa_kernel(SDPBackend.MATH):
                parts.append(sdpa_bshd(qq[:, a:b], kk[:, a:b], vv[:, a:b], causal))
        else:
            with plain_sdpa():
                parts.append(sdpa_bshd(qq[:, a:b], kk[:, a:b], vv[:, a:b], causal))
    o = torch.cat(parts, dim=1)
    grads = torch.autograd.grad(o, (qq, kk, vv), dout.to(dtype))
    return (o.detach(),) + tuple(t.detach() for t in grads)


def doc_offsets(S, n, seed):
    """n documents of random lengths (at least 1 token) packed into S tokens: [0, ..., S]."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(S - 1, generator=g)[: n - 1].add(1).sort().values.tolist()
    return [0] + cuts + [S]


def check_docs():
    """Packed documents given as cu_seqlens (thread ranks and a world-size-1 group) against SDPA
    run per document, under the bf16 rule (cuDNN takes no document mask: our kernels run)."""
    # (mode, ranks, algo, layout, causal, S, documents, H, H_kv, D)
    cases = [("threads", 2, "auto", "zigzag", True, 4096, 16, 8, 2, 128),
             ("threads", 3, "ring-return", "striped", True, 4000, 5, 8, 8, 64),
             ("threads", 2, "ulysses", "contiguous", False, 4096, 8, 8, 4, 128),
             ("group", 1, "auto", "zigzag", True, 4096, 32, 16, 4, 128)]
    all_ok = True
    for mode, ranks, algo, layout, causal, S, n, H, Hkv, D in cases:
        name = f"{mode} P={ranks} {algo}/{layout} causal={causal} S={S} docs={n} H={H}/{Hkv} D={D}"
        try:
            offsets = doc_offsets(S, n, seed=S + n)
            q, k, v, dout = case_inputs(S, H, Hkv, D, seed=S + H)
            oracle = reference_docs(q, k, v, dout, "oracle", causal, offsets)
            plain = reference_docs(q, k, v, dout, "plain", causal, offsets)
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            group = dist.group.WORLD if mode == "group" else None
            o = st.attention(qq, kk, vv, causal=causal, cu_seqlens=torch.tensor(offsets), algo=algo, layout=layout,
                             group=group, ranks=None if group else ranks)
            ours = (o.detach(),) + torch.autograd.grad(o, (qq, kk, vv), dout)
            all_ok &= rule_report("docs", name, ours, plain, oracle)
            del oracle, plain, ours, o
            torch.cuda.empty_cache()
        except Exception:
            all_ok &= report("docs", False, case=name, error=traceback.format_exc())
    return all_ok


def rule_report(check, name, ours, plain, oracle, **extra):
    figures, ok = {}, True
    for i, t in enumerate(("o", "dq", "dk", "dv")):
        good, err, bound = bf16_rule(ours[i], plain[i], oracle[i])
        ok &= good
        figures[t] = {"err": err, "bound": bound}
    return report(check, ok, case=name, **extra, **figures)


def check_sdpa():
    # (mode, ranks, algo, layout, causal, window_left, S, H, H_kv, D)
    cases = [("group", 1, "auto", "zigzag", True, -1, 4096, 16, 4, 128),
             ("threads", 2, "ring", "zigzag", True, -1, 4096, 8, 8, 128),
             ("threads", 4, "burst", "striped", True, -1, 4096, 8, 2, 64),
             ("threads", 3, "distflash", "contiguous", True, -1, 4000, 8, 8, 128),
             ("threads", 2, "auto", "zigzag", False, -1, 4096, 8, 4, 128),
             ("threads", 2, "ring", "contiguous", True, 1024, 4096, 8, 8, 128)]
    all_ok = True
    for mode, ranks, algo, layout, causal, left, S, H, Hkv, D in cases:
        name = f"{mode} P={ranks} {algo}/{layout} causal={causal} window_left={left} S={S} H={H}/{Hkv} D={D}"
        try:
            q, k, v, dout = case_inputs(S, H, Hkv, D, seed=S + H)
            oracle = reference(q, k, v, dout, "oracle", causal, left)
            plain = reference(q, k, v, dout, "plain", causal, left)
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            group = dist.group.WORLD if mode == "group" else None
            o = st.attention(qq, kk, vv, causal=causal, window_size=(left, -1), algo=algo, layout=layout,
                             group=group, ranks=None if group else ranks)
            ours = (o.detach(),) + torch.autograd.grad(o, (qq, kk, vv), dout)
            all_ok &= rule_report("sdpa", name, ours, plain, oracle)
            del oracle, plain, ours, o
            torch.cuda.empty_cache()
        except Exception:
            all_ok &= report("sdpa", False, case=name, error=traceback.format_exc())
    return all_ok


def check_multi():
    """Under torchrun, one GPU per process: each rank's shard through seqpar's NCCL communicator
    (bootstrapped from the group's store) against its rows of the whole-sequence references."""
    group, P, me = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    if P < 2:
        return report("multi", False, error="needs torchrun with 2 or more processes")
    cases = [("ring", "zigzag", True, 8192, 16, 4, 128), ("burst", "striped", True, 8192, 8, 8, 128),
             ("distflash", "contiguous", True, 8000, 8, 2, 128), ("auto", "zigzag", False, 8192, 8, 8, 64)]
    all_ok = True
    for algo, layout, causal, S, H, Hkv, D in cases:
        name = f"P={P} {algo}/{layout} causal={causal} S={S} H={H}/{Hkv} D={D}"
        try:
            q, k, v, dout = case_inputs(S, H, Hkv, D, seed=S + H)
            whole = [reference(q, k, v, dout, who, causal, -1) for who in ("oracle", "plain")]
            mine = [[st.shard(t, layout=layout, group=group) for t in res] for res in whole]
            qq, kk, vv = (st.shard(t, layout=layout, group=group).requires_grad_() for t in (q, k, v))
            o = st.attention(qq, kk, vv, causal=causal, algo=algo, layout=layout, group=group, seq_len=S)
            ours = (o.detach(),) + torch.autograd.grad(o, (qq, kk, vv), st.shard(dout, layout=layout, group=group))
            all_ok &= rule_report("multi", name, ours, mine[1], mine[0], rank=me)
            del whole, mine, ours, o
            torch.cuda.empty_cache()
        except Exception:
            all_ok &= report("multi", False, case=name, rank=me, error=traceback.format_exc())
    # Packed documents (cu_seqlens, global offsets) against SDPA per document.
    for algo, layout, causal, S, n, H, Hkv, D in [("auto", "zigzag", True, 8192, 16, 16, 4, 128),
                                                  ("ring-return", "striped", True, 8000, 64, 8, 8, 64)]:
        name = f"P={P} {algo}/{layout} causal={causal} S={S} docs={n} H={H}/{Hkv} D={D}"
        try:
            offsets = doc_offsets(S, n, seed=S + n)
            q, k, v, dout = case_inputs(S, H, Hkv, D, seed=S + H)
            whole = [reference_docs(q, k, v, dout, who, causal, offsets) for who in ("oracle", "plain")]
            mine = [[st.shard(t, layout=layout, group=group) for t in res] for res in whole]
            qq, kk, vv = (st.shard(t, layout=layout, group=group).requires_grad_() for t in (q, k, v))
            o = st.attention(qq, kk, vv, causal=causal, cu_seqlens=offsets, algo=algo, layout=layout, group=group,
                             seq_len=S)
            ours = (o.detach(),) + torch.autograd.grad(o, (qq, kk, vv), st.shard(dout, layout=layout, group=group))
            all_ok &= rule_report("multi", name, ours, mine[1], mine[0], rank=me)
            del whole, mine, ours, o
            torch.cuda.empty_cache()
        except Exception:
            all_ok &= report("multi", False, case=name, rank=me, error=traceback.format_exc())
    return all_ok


class _Block(torch.nn.Module):
    def __init__(self, group, ranks, heads=8, dim=64):
        super().__init__()
        self.group, self.ranks, self.heads, self.dim = group, ranks, heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim, dtype=BF16, device=DEV)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.dim).unbind(2)
        o = st.attention(q, k, v, causal=True, group=self.group, ranks=self.ranks)
        return o.float().square().mean()


def check_compile():
    ok_all = True
    for label, group, ranks in (("group P=1", dist.group.WORLD, None), ("threads P=2", None, 2)):
        try:
            torch.manual_seed(0)
            block = _Block(group, ranks)
            x = torch.randn(1, 2048, 512, device=DEV, dtype=BF16)
            eager = block(x)
            eager_grads = torch.autograd.grad(eager, list(block.parameters()))
            explain = torch._dynamo.explain(block)(x)
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True)
            loss = compiled(x)
            grads = torch.autograd.grad(loss, list(block.parameters()))
            loss_rel = abs(loss.item() - eager.item()) / abs(eager.item())
            grad_rel = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, eager_grads))
            ok = explain.graph_break_count == 0 and loss_rel <= 1e-2 and grad_rel <= 2e-2
            ok_all &= report("compile", ok, case=label, graph_breaks=explain.graph_break_count,
                             graphs=explain.graph_count, loss_rel=loss_rel, grad_rel_frobenius=grad_rel)
        except Exception:
            ok_all &= report("compile", False, case=label, error=traceback.format_exc())
    return ok_all


def check_hf():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=16384,
                         attention_dropout=0.0, tie_word_embeddings=False)
    S = 4096
    tmp = tempfile.mkdtemp(prefix="seqpar_hf_")
    # Weights representable in bf16, so the float32 oracle and the bf16 models share them.
    LlamaForCausalLM(config).to(BF16).to(torch.float32).save_pretrained(tmp)
    ids = torch.randint(0, config.vocab_size, (1, S), device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))

    def run(impl, dtype, batch):
        model = LlamaForCausalLM.from_pretrained(tmp, attn_implementation=impl, dtype=dtype).to(DEV)
        loss = model(**batch).loss
        loss.backward()
        out = {"loss": loss.detach().double()}
        out.update({n: p.grad.detach().double() for n, p in model.named_parameters()})
        del model
        torch.cuda.empty_cache()
        return out

    whole = {"input_ids": ids, "labels": ids, "use_cache": False}
    with sdpa_kernel(SDPBackend.MATH):
        oracle = run("sdpa", torch.float32, whole)
    with plain_sdpa():
        plain = run("sdpa", BF16, whole)
    ok_all = True
    for label in ("threads P=2", "group P=1"):
        try:
            if label.startswith("threads"):
                seqpar.hf.register(ranks=2, layout="zigzag")
                batch = whole
            else:
                seqpar.hf.register(group=dist.group.WORLD, layout="zigzag")
                batch = seqpar.hf.shard_batch(ids, ids, group=dist.group.WORLD)
            ours = run("seqpar", BF16, batch)
            worst, ok, figures = None, True, {}
            for name in oracle:
                good, err, bound = bf16_rule(ours[name], plain[name], oracle[name])
                ok &= good
                ratio = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
                if worst is None or ratio > worst[1]:
                    worst = (name, ratio, err, bound)
                if name == "loss":
                    figures["loss"] = {"ours": ours[name].item(), "sdpa_bf16": plain[name].item(),
                                       "fp32": oracle[name].item(), "err": err, "bound": bound}
            ok_all &= report("hf", ok, case=label, S=S, worst_tensor=worst[0], worst_err_over_bound=worst[1], **figures)
        except Exception:
            ok_all &= report("hf", False, case=label, error=traceback.format_exc())
    return ok_all


class _Attn(torch.nn.Module):
    is_causal = True


def check_overhead(seqs, iters):
    ok_all = True
    for S in seqs:
        try:
            B, H, Hkv, D = 1, 32, 8, 128
            g = torch.Generator(device=DEV).manual_seed(2)
            # transformers hands the attention [B, H, S, D] tensors (RoPE's outputs, contiguous).
            query = torch.randn(B, H, S, D, device=DEV, generator=g).to(BF16).requires_grad_()
            key = torch.randn(B, Hkv, S, D, device=DEV, generator=g).to(BF16).requires_grad_()
            value = torch.randn(B, Hkv, S, D, device=DEV, generator=g).to(BF16).requires_grad_()
            dout = torch.randn(B, S, H, D, device=DEV, generator=g).to(BF16)
            # The direct path: the C++ API through the binding on the same rank, BSHD buffers made once.
            rank = torch_ranks.group_rank(dist.group.WORLD, DEV)
            q, k, v = (t.detach().transpose(1, 2).contiguous() for t in (query, key, value))
            o, lse = torch.empty_like(q), torch.empty(B, H, S, device=DEV)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            opts = dict(window_left=-1, window_right=0, scale=D ** -0.5, algo="auto", layout="zigzag", seq_len=S)

            def direct():
                stream = torch.cuda.current_stream().cuda_stream if DEV.type == "cuda" else 0
                _core.shard_attention(rank, q, k, v, o, lse, None, None, None, None, stream=stream, **opts)
                _core.shard_attention(rank, q, k, v, o, lse, dout, dq, dk, dv, stream=stream, **opts)

            seqpar.hf.register(group=dist.group.WORLD, layout="zigzag", seq_len=S)
            module = _Attn()

            def through_hf():
                for t in (query, key, value):
                    t.grad = None
                out, _ = seqpar.hf.attention_forward(module, query, key, value, None, scaling=D ** -0.5)
                out.backward(dout)

            times = {"direct": [], "hf": []}
            for i in range(iters + 3):
                for name, fn in (("direct", direct), ("hf", through_hf)) if i % 2 == 0 else (("hf", through_hf), ("direct", direct)):
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    if i >= 3:  # warm-up: plans, cuDNN graphs, pools
                        times[name].append(time.perf_counter() - t0)
            direct_ms = statistics.median(times["direct"]) * 1e3
            hf_ms = statistics.median(times["hf"]) * 1e3
            overhead = hf_ms / direct_ms - 1
            # The same numbers: seqpar.hf's gradients are the direct call's (up to the order of
            # cuDNN's atomic adds).
            same = all(torch.allclose(a.transpose(1, 2).float(), b.float(), rtol=2e-2, atol=1e-2 * b.abs().max().item())
                       for a, b in ((query.grad, dq), (key.grad, dk), (value.grad, dv)))
            ok_all &= report("overhead", overhead < 0.02 and same, S=S, heads=H, kv_heads=Hkv, head_dim=D,
                             iters=iters, direct_ms=direct_ms, hf_ms=hf_ms, overhead=overhead,
                             same_gradients=same, direct_all_ms=[t * 1e3 for t in times["direct"]],
                             hf_all_ms=[t * 1e3 for t in times["hf"]])
            del query, key, value, q, k, v, o, lse, dq, dk, dv, dout
            torch.cuda.empty_cache()
        except Exception:
            ok_all &= report("overhead", False, S=S, error=traceback.format_exc())
    return ok_all


def main():
    global _jsonl
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", default="sdpa,docs,compile,hf,overhead")
    parser.add_argument("--overhead-seqs", default="32768,65536")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--jsonl")
    args = parser.parse_args()
    if args.jsonl:
        _jsonl = open(args.jsonl, "a")
    torch.cuda.set_device(DEV)
    if "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("nccl", device_id=DEV)
    else:  # a group of one process, for the group path on one GPU
        init = os.path.join(tempfile.mkdtemp(prefix="seqpar_pg_"), "init")
        dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1, device_id=DEV)
    emit({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(DEV), "seqpar": seqpar.__version__,
          "nccl": _core.nccl_available()})
    runs = {"sdpa": check_sdpa, "docs": check_docs, "multi": check_multi, "compile": check_compile, "hf": check_hf,
            "overhead": lambda: check_overhead([int(s) for s in args.overhead_seqs.split(",")], args.iters)}
    summary = {}
    for name in args.checks.split(","):
        t0 = time.time()
        try:
            summary[name] = runs[name]()
        except Exception:
            summary[name] = report(name, False, error=traceback.format_exc())
        print(f"== {name}: {'PASS' if summary[name] else 'FAIL'} ({time.time() - t0:.0f} s)", flush=True)
    for name, ok in summary.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    dist.destroy_process_group()
    return 0 if all(summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
