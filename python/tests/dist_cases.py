"""Cases that run inside each gloo process of the distributed tests (dist_harness.run): each
rank builds the same full problem from a seed, computes its shard through seqpar.torch over the
group, and compares it with PyTorch's SDPA on the full sequence (outputs, LSE, gradients)."""
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import seqpar.torch as st
from seqpar import torch_ranks

# (algo, layout, causal, window, seq, heads, kv_heads, dtype)
CONFIGS = [
    ("ring", "zigzag", True, (-1, -1), 67, 4, 2, "float32"),
    ("burst", "striped", False, (-1, -1), 64, 4, 4, "float32"),
    ("distflash", "contiguous", True, (-1, -1), 61, 4, 1, "float32"),
    ("burst-return", "striped", True, (-1, -1), 50, 2, 2, "float32"),
    ("auto", "zigzag", True, (7, -1), 64, 4, 2, "float32"),
    ("auto", "contiguous", False, (4, 2), 45, 2, 1, "float32"),
    ("ring", "zigzag", True, (-1, -1), 40, 4, 2, "float64"),
]


def sdpa_reference(q, k, v, causal, window, scale=None):
    """SDPA over the full sequence in [B, S, H, D], with the window as a boolean mask; also LSE."""
    S = q.shape[1]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    ok = torch.ones(S, S, dtype=torch.bool)
    left, right = window[0], 0 if causal else window[1]
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=ok, scale=scale, enable_gqa=True).transpose(1, 2)
    groups = q.shape[2] // k.shape[2]
    scores = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(groups, 2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    lse = torch.logsumexp(scores.masked_fill(~ok, float("-inf")), dim=-1)
    return o, lse


def rel_err(got, want):
    return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()


def attention_vs_sdpa(rank, world):
    group = dist.group.WORLD
    out = []
    for n, (algo, layout, causal, window, S, H, Hkv, dtype_name) in enumerate(CONFIGS):
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(S * 31 + H)
        q = torch.randn(2, S, H, 16, generator=g, dtype=dtype, requires_grad=True)
        k = torch.randn(2, S, Hkv, 16, generator=g, dtype=dtype, requires_grad=True)
        v = torch.randn(2, S, Hkv, 16, generator=g, dtype=dtype, requires_grad=True)
        dout = torch.randn(2, S, H, 16, generator=g, dtype=dtype)
        ref_o, ref_lse = sdpa_reference(q, k, v, causal, window)
        ref_grads = torch.autograd.grad(ref_o, (q, k, v), dout)

        def mine(t, dim=1):
            return st.shard(t.detach(), layout=layout, group=group, dim=dim)

        lq, lk, lv = (mine(t).requires_grad_() for t in (q, k, v))
        o, lse = st.attention(lq, lk, lv, causal=causal, window_size=window, algo=algo, group=group,
                              layout=layout, seq_len=S if n % 2 else None, return_lse=True)
        grads = torch.autograd.grad(o, (lq, lk, lv), mine(dout))
        errs = {"o": rel_err(o, mine(ref_o)), "lse": rel_err(lse, mine(ref_lse, dim=2))}
        for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
            errs[name] = rel_err(got, mine(want))
        out.append({"config": f"{algo}/{layout}/causal={causal}/window={window}/S={S}/H={H}/{Hkv}/{dtype_name}",
                    "dtype": dtype_name, "errors": errs, "lse_requires_grad": lse.requires_grad,
                    "o_dtype": str(o.dtype)})
    counters = torch_ranks.group_rank(group, torch.device("cpu")).counters()
    return {"cases": out, "counters": counters}


def documents_vs_sdpa(rank, world):
    """Packed documents given as cu_seqlens (global offsets) over the gloo group: values and
    gradients against SDPA run on each document alone, float32."""
    group = dist.group.WORLD
    out = []
    for algo, layout, causal in (("auto", "zigzag", True), ("ring-return", "striped", False),
                                 ("distflash", "contiguous", True), ("ring", "documents", True)):
        offsets = [0, 9, 10, 33, 40, 61]
        S = offsets[-1]
        g = torch.Generator().manual_seed(5)
        q = torch.randn(1, S, 4, 16, generator=g, requires_grad=True)
        k = torch.randn(1, S, 2, 16, generator=g, requires_grad=True)
        v = torch.randn(1, S, 2, 16, generator=g, requires_grad=True)
        dout = torch.randn(1, S, 4, 16, generator=g)
        parts = []
        for a, b in zip(offsets[:-1], offsets[1:]):
            qt, kt, vt = (t[:, a:b].transpose(1, 2) for t in (q, k, v))
            parts.append(F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2))
        ref_o = torch.cat(parts, dim=1)
        ref_grads = torch.autograd.grad(ref_o, (q, k, v), dout)

        def mine(t):
            return st.shard(t.detach(), layout=layout, group=group, dim=1, cu_seqlens=offsets)

        lq, lk, lv = (mine(t).requires_grad_() for t in (q, k, v))
        o = st.attention(lq, lk, lv, causal=causal, cu_seqlens=torch.tensor(offsets), algo=algo, group=group,
                         layout=layout)
        grads = torch.autograd.grad(o, (lq, lk, lv), mine(dout))
        errs = {"o": rel_err(o, mine(ref_o))}
        for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
            errs[name] = rel_err(got, mine(want))
        out.append({"config": f"{algo}/{layout}/causal={causal}", "errors": errs})
    return out


class _Block(torch.nn.Module):
    def __init__(self, group, heads=4, dim=16):
        super().__init__()
        self.group, self.heads, self.dim = group, heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.dim).unbind(2)
        o = st.attention(q, k, v, causal=True, group=self.group, layout="zigzag")
        return (o.reshape(B, S, -1) ** 2).sum()


def compile_fullgraph(rank, world):
    """torch.compile(fullgraph=True) of a module calling seqpar.torch.attention over the group:
    compiles without a graph break and gives eager's loss and gradients."""
    torch.manual_seed(0)
    block = _Block(dist.group.WORLD)
    x = st.shard(torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1)), group=dist.group.WORLD)
    eager = block(x)
    eager_grads = torch.autograd.grad(eager, list(block.parameters()))
    explain = torch._dynamo.explain(block)(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    grads = torch.autograd.grad(loss, list(block.parameters()))
    return {"graph_breaks": explain.graph_break_count, "graphs": explain.graph_count,
            "loss_err": rel_err(loss, eager), "grad_err": max(rel_err(a, b) for a, b in zip(grads, eager_grads))}


def errors(rank, world):
    """Bad arguments raise Python exceptions with the reason (every rank sees the same problem,
    so no rank is left waiting)."""
    group = dist.group.WORLD
    q = torch.randn(1, 16, 4, 8)
    k = torch.randn(1, 16, 2, 8)
    seen = {}

    def expect(name, exc, fn):
        try:
            fn()
            seen[name] = "no exception"
        except exc as e:
            seen[name] = "ok: " + str(e)
        except Exception as e:  # the wrong kind
            seen[name] = f"wrong exception {type(e).__name__}: {e}"

    expect("dtype", TypeError, lambda: st.attention(q.half(), k.half(), k.half(), group=group))
    expect("mixed dtypes", TypeError, lambda: st.attention(q, k.double(), k, group=group))
    expect("shape", ValueError, lambda: st.attention(q[0], k, k, group=group))
    expect("heads", ValueError, lambda: st.attention(q, k[:, :, :1].expand(1, 16, 3, 8).contiguous(),
                                                     k[:, :, :1].expand(1, 16, 3, 8).contiguous(), group=group))
    expect("kv shape", ValueError, lambda: st.attention(q, k, k[:, :8], group=group))
    expect("group size", ValueError, lambda: st.attention(q, k, k, group=group, ranks=world + 1))
    expect("too short for the group", ValueError,
           lambda: st.attention(q[:, :1], k[:, :1], k[:, :1], group=group, layout="zigzag"))
    expect("seq_len", ValueError, lambda: st.attention(q, k, k, group=group, seq_len=16 * world + 5))
    expect("algo", ValueError, lambda: st.attention(q, k, k, group=group, algo="nope"))
    expect("layout", ValueError, lambda: st.attention(q, k, k, group=group, layout="diagonal"))
    expect("window", ValueError, lambda: st.attention(q, k, k, group=group, window_size=(-3, 0)))
    expect("not a tensor", TypeError, lambda: st.attention(q.numpy(), k, k, group=group))
    # Non-contiguous inputs are copied, not refused: the result matches the contiguous one.
    qt = torch.randn(1, 4, 16, 8).transpose(1, 2)
    a = st.attention(qt, k, k, group=group)
    b = st.attention(qt.contiguous(), k, k, group=group)
    seen["non-contiguous"] = "ok" if torch.equal(a, b) else "differs"
    return seen


def silent_peer(rank, world, linger_s=0.0):
    """Rank 1 never joins the attention (it lingers, then exits); rank 0 must fail with an
    error, not wait forever."""
    if rank == 1:
        time.sleep(linger_s)
        os._exit(0)
    q = torch.randn(1, 32, 2, 8)
    t0 = time.monotonic()
    try:
        st.attention(q, q, q, causal=True, group=dist.group.WORLD, algo="ring")
        return {"raised": None, "seconds": time.monotonic() - t0}
    except Exception as e:
        return {"raised": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}


def hf_vs_sdpa(rank, world, model_dir, layout="zigzag", seq=48):
    """transformers' LlamaForCausalLM with attn_implementation="seqpar" over the group (each rank
    its shard of the sequences) against attn_implementation="sdpa" on the whole sequences: the
    summed loss and the summed gradients."""
    from transformers import LlamaForCausalLM

    import seqpar.hf

    group = dist.group.WORLD
    seqpar.hf.register(group=group, layout=layout)
    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="seqpar", dtype=torch.float32)
    ref = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.config.vocab_size, (2, seq), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100  # some targets ignored, unevenly over the ranks
    loss = model(**seqpar.hf.shard_batch(ids, labels, group=group)).loss
    loss.backward()
    seqpar.hf.all_reduce_gradients(model, group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    ref_loss = ref(input_ids=ids, labels=labels, use_cache=False).loss
    ref_loss.backward()
    grad_errs = {}
    for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
        grad_errs[name] = ((p.grad - p_ref.grad).abs().max() / p_ref.grad.abs().max().clamp_min(1e-30)).item()
    return {"loss": total.item(), "ref_loss": ref_loss.item(), "attn": model.config._attn_implementation,
            "grad_errs": grad_errs}


def packed_per_document_reference(ref, ids, labels, starts):
    """A packed row run as transformers' sdpa model sees each document alone (positions from 0):
    its logits joined, the causal LM's loss over the row (labels at document starts ignored, so
    no target crosses a boundary), the loss's backward into ref."""
    pieces = [ref(input_ids=ids[:, a:b], position_ids=torch.arange(b - a).unsqueeze(0), use_cache=False).logits
              for a, b in zip(starts[:-1], starts[1:])]
    logits = torch.cat(pieces, dim=1)
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100)
    loss.backward()
    return loss


def packed_row(vocab, starts, seed=5):
    """One row of packed documents starting at `starts` (the last entry: the length): token ids,
    position ids restarting at 0 in each, and labels with every document's first token ignored."""
    g = torch.Generator().manual_seed(seed)
    n = starts[-1]
    ids = torch.randint(0, vocab, (1, n), generator=g)
    pos = torch.cat([torch.arange(b - a) for a, b in zip(starts[:-1], starts[1:])]).unsqueeze(0)
    labels = ids.clone()
    labels[0, starts[:-1]] = -100
    return ids, pos, labels


def hf_packed_vs_sdpa(rank, world, model_dir, layout="zigzag", starts=(0, 7, 8, 30, 48)):
    """Packed documents through the drop-in over the group (shard_batch with the row's position
    ids) against sdpa run on each document alone: the summed loss and gradients."""
    from transformers import LlamaForCausalLM

    import seqpar.hf

    group = dist.group.WORLD
    seqpar.hf.register(group=group, layout=layout)
    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="seqpar", dtype=torch.float32)
    ref = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    ids, pos, labels = packed_row(model.config.vocab_size, list(starts))
    loss = model(**seqpar.hf.shard_batch(ids, labels, group=group, position_ids=pos)).loss
    loss.backward()
    seqpar.hf.all_reduce_gradients(model, group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    ref_loss = packed_per_document_reference(ref, ids, labels, list(starts))
    grad_errs = {}
    for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
        grad_errs[name] = ((p.grad - p_ref.grad).abs().max() / p_ref.grad.abs().max().clamp_min(1e-30)).item()
    return {"loss": total.item(), "ref_loss": ref_loss.item(), "attn": model.config._attn_implementation,
            "grad_errs": grad_errs}


def nccl_id_through_the_store(rank, world):
    """The NCCL bootstrap's exchange (torch_ranks._nccl_rank) without a GPU: rank 0's unique id
    reaches every rank through the group's store, a fresh one for each communicator made."""
    from seqpar import _core
    got = []
    saved = {n: getattr(_core, n) for n in ("rank_from_nccl_id", "nccl_available", "nccl_unique_id")}
    try:
        _core.rank_from_nccl_id = lambda uid, r, size, device: (uid.hex(), r, size)
        if not _core.nccl_available():  # a module without NCCL: any 128 bytes stand for the id
            _core.nccl_available, _core.nccl_unique_id = (lambda: True), (lambda: os.urandom(128))
        for _ in range(2):
            got.append(torch_ranks._nccl_rank(dist.group.WORLD, "world", torch.device("cuda", 0)))
    finally:
        for n, f in saved.items():
            setattr(_core, n, f)
    return got


def gather_round_trip(rank, world):
    """seqpar.torch.gather puts every rank's shard (of unequal lengths) back in place."""
    x = torch.randn(2, 37, 3, generator=torch.Generator().manual_seed(9))
    out = {}
    for layout in ("zigzag", "striped", "contiguous"):
        local = st.shard(x, layout=layout, group=dist.group.WORLD)
        out[layout] = bool(torch.equal(st.gather(local, layout=layout, group=dist.group.WORLD), x))
    return out
