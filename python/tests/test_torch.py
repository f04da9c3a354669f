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
