"""seqpar.torch.attention (autograd over DLPack) against plain PyTorch attention: outputs and
the gradients autograd gets through it. Skipped where torch is not installed."""
import pytest

torch = pytest.importorskip("torch")
import seqpar.torch as st  # noqa: E402


def torch_attention(q, k, v, left, right):
    # [B, S, H, D] in, the same out; query head h reads key/value head h // (H / H_kv).
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / q.shape[-1] ** 0.5
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(q.shape[1])[None, :]
    ok = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("algo,layout,ranks,causal,window", [
    ("ring", "zigzag", 2, True, (-1, -1)), ("burst", "striped", 3, False, (-1, -1)),
    ("distflash", "contiguous", 4, True, (-1, -1)), ("auto", "zigzag", 3, False, (4, 1)),
    # One rank reads and writes the caller's tensors themselves (no shard copies).
    ("auto", "zigzag", 1, True, (-1, -1)), ("ring", "striped", 1, False, (4, 1)),
])
def test_matches_torch_with_gradients(dtype, tol, algo, layout, ranks, causal, window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 29, 4, 8, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 29, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 29, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    dout = torch.randn(2, 29, 4, 8, generator=g, dtype=dtype)
    o = st.attention(q, k, v, causal=causal, window=window, algo=algo, ranks=ranks, layout=layout)
    grads = torch.autograd.grad(o, (q, k, v), dout)
    left, right = window[0], 0 if causal else window[1]
    o_ref = torch_attention(q, k, v, left, right)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v), dout)
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o,) + grads, (o_ref,) + grads_ref):
        assert got.dtype == dtype and got.shape == want.shape, name
        err = (got - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), f"{name}: {err:.3g}"


def test_gradcheck_and_lse():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 9, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: st.attention(a, b, c, causal=True, ranks=2), (q, k, v))
    o, lse = st.attention(q, k, v, return_lse=True)
    assert lse.shape == (1, 2, 9) and not lse.requires_grad and o.requires_grad


def test_non_contiguous_tensors_are_copied_and_errors_are_python_exceptions():
    q = torch.randn(1, 4, 12, 8, dtype=torch.float64).transpose(1, 2)  # [B, S, H, D] view of BHSD
    k = torch.randn(1, 12, 4, 8, dtype=torch.float64)
    o = st.attention(q, k, k, ranks=2)
    assert torch.allclose(o, torch_attention(q, k, k, -1, -1), atol=1e-10)
    with pytest.raises(TypeError, match="float32 or float64"):
        st.attention(q.to(torch.float16), k.to(torch.float16), k.to(torch.float16))
    with pytest.raises(TypeError, match="torch.Tensor"):
        st.attention(q.numpy(), k, k)
    with pytest.raises(ValueError, match="divisible"):
        st.attention(q, k[:, :, :3], k[:, :, :3])


def test_flash_attn_argument_names_and_thread_ranks_sharing_nothing_but_the_call():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 24, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    a = st.attention(q, k, v, causal=True, window_size=(5, -1), softmax_scale=0.3, ranks=3, layout="striped")
    b = st.attention(q, k, v, causal=True, window=(5, -1), scale=0.3, ranks=2, layout="contiguous")
    ref = torch_attention(q * (0.3 * 8 ** 0.5), k, v, 5, 0)  # the scale folded into q
    assert torch.allclose(a, ref, atol=1e-10) and torch.allclose(b, ref, atol=1e-10)
    with pytest.raises(ValueError, match="whole sequence"):
        st.attention(q, k, v, ranks=2, seq_len=30)
    with pytest.raises(ValueError, match="4-D"):
        st.attention(q[0], k, v)


def test_custom_op_and_torch_compile_fullgraph():
    # The op is registered with torch.library (opcheck: schema, fake tensors, autograd), and a
    # module calling it compiles whole with the default backend (inductor).
    q, k, v = (torch.randn(1, 20, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    torch.library.opcheck(torch.ops.seqpar.attention_forward.default, (q, k, v, -1, 0, 0.0, "ring", "zigzag", 0, "", 2, [], ""))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 96)

        def forward(self, x):
            qkv = self.proj(x).view(2, 40, 3, 4, 8)
            return st.attention(*qkv.unbind(2), causal=True, ranks=3).square().sum()

    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 40, 32)
    eager = block(x)
    eager_grads = torch.autograd.grad(eager, list(block.parameters()))
    assert torch._dynamo.explain(block)(x).graph_break_count == 0
    loss = torch.compile(block, fullgraph=True)(x)
    grads = torch.autograd.grad(loss, list(block.parameters()))
    assert torch.allclose(loss, eager, rtol=1e-5)
    for a, b in zip(grads, eager_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


def test_a_failed_call_leaves_the_next_one_working():
    # A rank that fails aborts its thread ranks' communicator; the next call gets fresh ones.
    q = torch.randn(1, 16, 2, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="supported|refuse|distflash|mask|causal"):
        st.attention(q, q, q, algo="distflash", layout="striped", ranks=2)
    assert torch.allclose(st.attention(q, q, q, causal=True, ranks=2), torch_attention(q, q, q, -1, 0), atol=1e-10)


def sdpa_per_document(q, k, v, offsets, causal):
    """PyTorch's SDPA run on each document alone ([B, S, H, D] slices), the outputs put together."""
    parts = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        qt, kt, vt = (t[:, a:b].transpose(1, 2) for t in (q, k, v))
        parts.append(torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                      enable_gqa=True).transpose(1, 2))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("algo,layout,ranks,causal", [
    ("auto", "zigzag", 2, True), ("ring", "striped", 3, False), ("burst-return", "zigzag", 4, True),
    ("ulysses", "contiguous", 2, True), ("ring", "documents", 3, True), ("burst-return", "documents", 4, True),
    ("auto", "documents", 1, True),
])
def test_documents_from_cu_seqlens_match_sdpa_per_document(dtype, tol, algo, layout, ranks, causal):
    # Packed documents of unequal lengths, one of a single token: the values and the gradients
    # of q, k and v equal SDPA run on each document by itself.
    g = torch.Generator().manual_seed(3)
    offsets = [0, 11, 12, 30, 47, 53]
    S = offsets[-1]
    q = torch.randn(2, S, 4, 8, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(2, S, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(2, S, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    dout = torch.randn(2, S, 4, 8, generator=g, dtype=dtype)
    o = st.attention(q, k, v, causal=causal, cu_seqlens=torch.tensor(offsets, dtype=torch.int32), algo=algo,
                     ranks=ranks, layout=layout)
    grads = torch.autograd.grad(o, (q, k, v), dout)
    o_ref = sdpa_per_document(q, k, v, offsets, causal)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v), dout)
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o,) + grads, (o_ref,) + grads_ref):
        err = (got - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), f"{name}: {err:.3g}"


def test_mask_text_reaches_block_sparse_patterns(tmp_path):
    # A block pattern written to a file (blocks of 4 tokens: each query block sees itself and
    # block 0, under the causal band) against the same mask made by hand.
    S, B = 24, 4
    n = S // B
    rows = [[1 if kb == qb or kb == 0 else 0 for kb in range(n)] for qb in range(n)]
    path = tmp_path / "pattern.txt"
    path.write_text(f"block_size {B}\n" + "".join(" ".join(map(str, r)) + "\n" for r in rows))
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, S, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = st.attention(q, k, v, mask=f"blocks-causal:{path}", ranks=3, algo="ring")
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    ok = (j <= i) & ((j // B == i // B) | (j // B == 0))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    o_ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=ok).transpose(1, 2)
    assert (o - o_ref).abs().max().item() <= 1e-10
    dq, dq_ref = (torch.autograd.grad(x.sum(), q)[0] for x in (o, o_ref))
    assert (dq - dq_ref).abs().max().item() <= 1e-10
    with pytest.raises(ValueError, match="not both"):
        st.attention(q, k, v, causal=True, mask="causal", ranks=2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        st.attention(q, k, v, cu_seqlens=[0, 5, 20], ranks=2)  # ends before the 24 tokens
    with pytest.raises(TypeError, match="cu_seqlens"):
        st.attention(q, k, v, cu_seqlens="0,24", ranks=2)
