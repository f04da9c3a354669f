"""seqpar.attention against the numpy float64 oracle: outputs, LSE and gradients, for every
algorithm, layout and mask at several rank counts (float64 to 1e-10, float32 to 1e-5)."""
import numpy as np
import pytest

import reference
import seqpar

ALGOS = sorted(seqpar.algorithms())
MASKS = {"full": dict(), "causal": dict(causal=True), "window": dict(window=(5, 2))}
TOL = {np.float64: 1e-10, np.float32: 1e-5}


def inputs(dtype, B=2, S=37, H=4, H_kv=2, D=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, S, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, H_kv, D)).astype(dtype)
    v = rng.standard_normal((B, S, H_kv, D)).astype(dtype)
    dout = rng.standard_normal((B, S, H, D)).astype(dtype)
    return q, k, v, dout


def window_of(mask):
    kw = MASKS[mask]
    left, right = kw.get("window", (-1, -1))
    return (left, 0) if kw.get("causal") else (left, right)


def assert_close(name, got, want, tol):
    # The bound scales with the tensor's largest value (LSE and summed gradients exceed 1).
    bound = tol * max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= bound, f"{name}: max |err| {err:.3g} > {bound:.3g}"


def refusal(algo, layout, ranks, mask, heads):
    """The reason an algorithm refuses the problem (a ValueError matching it), or None."""
    if algo == "distflash" and ranks > 1 and (layout, mask) != ("contiguous", "causal"):
        # DistFlashAttn computes only pairs with keys before queries on the contiguous layout.
        return "distflash"
    if algo == "ulysses" and heads % ranks:
        return "do not split into"  # the Ulysses degree must divide the heads
    if algo == "ulysses-overlap" and ranks > 1 and heads % (2 * ranks):
        return "do not split into"  # two head parts a rank
    if algo.startswith("attention2d") and int(ranks ** 0.5) ** 2 != ranks:
        return "square number of ranks"
    return None


def run_and_check(dtype, algo, layout, ranks, mask, **shape):
    q, k, v, dout = inputs(dtype, **shape)
    call = dict(algo=algo, ranks=ranks, layout=layout, return_lse=True, dout=dout, **MASKS[mask])
    why = refusal(algo, layout, ranks, mask, q.shape[2])
    if why:  # refused, with the reason
        with pytest.raises(ValueError, match=why):
            seqpar.attention(q, k, v, **call)
        return
    o, lse, dq, dk, dv = seqpar.attention(q, k, v, **call)
    want = reference.attention(q, k, v, dout, window=window_of(mask))
    for name, got in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv)):
        assert got.dtype == dtype and got.shape == want[name].shape, name
        assert_close(name, got, want[name], TOL[dtype])


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", seqpar.layouts())
@pytest.mark.parametrize("algo", ALGOS + ["auto"])
def test_fp64_every_algorithm(algo, layout, ranks, mask):
    run_and_check(np.float64, algo, layout, ranks, mask)


@pytest.mark.parametrize("algo,layout,ranks,mask", [
    ("ring", "zigzag", 2, "causal"), ("burst", "striped", 3, "full"),
    ("distflash", "contiguous", 4, "causal"), ("auto", "zigzag", 4, "window"),
])
def test_fp32(algo, layout, ranks, mask):
    run_and_check(np.float32, algo, layout, ranks, mask)


@pytest.mark.parametrize("ulysses,ring_algo", [(2, None), (2, "burst"), (4, "ring"), (0, None)])
def test_ulysses_ring_options(ulysses, ring_algo):
    # Ulysses x ring on 8 thread ranks: the degree and the ring dimension's algorithm chosen.
    q, k, v, dout = inputs(np.float64, S=48, H=8, H_kv=4)
    o, lse, dq, dk, dv = seqpar.attention(q, k, v, causal=True, algo="ulysses-ring", ranks=8, ulysses=ulysses,
                                          ring_algo=ring_algo, return_lse=True, dout=dout)
    want = reference.attention(q, k, v, dout, window=(-1, 0))
    for name, got in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv)):
        assert_close(name, got, want[name], TOL[np.float64])


def test_algorithm_options_refused_with_reasons():
    q, k, v, _ = inputs(np.float64)
    for kwargs, why in ((dict(algo="ulysses-ring", ulysses=3, ranks=4), "must divide the ranks"),
                        (dict(algo="ulysses-ring", ring_algo="attention2d", ranks=4), "ring-family"),
                        (dict(algo="ulysses-ring", ring_algo="nope", ranks=4), "names no algorithm"),
                        (dict(algo="ring", ulysses=-1), "degree")):
        with pytest.raises(ValueError, match=why):
            seqpar.attention(q, k, v, **kwargs)
    assert seqpar.algorithm_spec("ulysses-ring", 2, "burst") == "ulysses-ring:ulysses=2,ring=burst"


def test_mqa_and_uneven_length():
    # One key/value head for eight query heads; 41 tokens over 3 ranks in 6 zigzag chunks.
    run_and_check(np.float64, "ring", "zigzag", 3, "causal", B=1, S=41, H=8, H_kv=1, D=4)


def test_every_rejecting_algorithm_still_leaves_cases_run():
    # distflash runs contiguous causal problems: the skip above must not hide it everywhere.
    run_and_check(np.float64, "distflash", "contiguous", 3, "causal")


def test_forward_only_and_return_forms():
    q, k, v, _ = inputs(np.float64)
    o = seqpar.attention(q, k, v, causal=True, algo="ring", ranks=2)
    assert isinstance(o, np.ndarray) and o.shape == q.shape
    o2, lse = seqpar.attention(q, k, v, causal=True, algo="ring", ranks=2, return_lse=True)
    want = reference.attention(q, k, v, window=(-1, 0))
    assert_close("o", o, want["o"], 1e-10)
    assert_close("o", o2, want["o"], 1e-10)
    assert_close("lse", lse, want["lse"], 1e-10)


def test_scale_and_read_only_inputs():
    q, k, v, _ = inputs(np.float64)
    for x in (q, k, v):
        x.setflags(write=False)
    o = seqpar.attention(q, k, v, scale=0.5, algo="burst", ranks=3, layout="striped")
    assert_close("o", o, reference.attention(q, k, v, scale=0.5)["o"], 1e-10)


@pytest.mark.parametrize("algo,layout,ranks", [("ring", "zigzag", 3), ("burst", "contiguous", 2),
                                               ("double-ring", "striped", 4)])
def test_backward_alone(algo, layout, ranks):
    # The backward against the oracle's own o and lse (as an autograd function runs it).
    q, k, v, dout = inputs(np.float64)
    want = reference.attention(q, k, v, dout, window=(-1, 0))
    dq, dk, dv = seqpar.attention_backward(q, k, v, want["o"], want["lse"], dout, causal=True,
                                           algo=algo, ranks=ranks, layout=layout)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert_close(name, got, want[name], 1e-10)


@pytest.mark.parametrize("algo,layout,ranks,causal", [("auto", "zigzag", 3, True), ("ring-return", "striped", 2, False),
                                                      ("burst", "documents", 3, True), ("ring", "documents", 4, False)])
def test_documents_from_cu_seqlens_match_the_oracle_per_document(algo, layout, ranks, causal):
    # Packed documents: each document's rows equal the oracle run on that document alone.
    rng = np.random.default_rng(7)
    offsets = [0, 13, 14, 40, 57]
    q = rng.standard_normal((1, 57, 4, 8))
    k, v = rng.standard_normal((1, 57, 2, 8)), rng.standard_normal((1, 57, 2, 8))
    dout = rng.standard_normal((1, 57, 4, 8))
    o, dq, dk, dv = seqpar.attention(q, k, v, causal=causal, cu_seqlens=offsets, algo=algo, ranks=ranks, layout=layout,
                                     dout=dout)
    for a, b in zip(offsets[:-1], offsets[1:]):
        want = reference.attention(q[:, a:b], k[:, a:b], v[:, a:b], dout[:, a:b], window=(-1, 0 if causal else -1))
        for name, got in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert np.abs(got[:, a:b] - want[name]).max() <= 1e-10, f"{name} of document {a}:{b}"
    with pytest.raises(ValueError, match="cu_seqlens"):
        seqpar.attention(q, k, v, cu_seqlens=[0, 20], ranks=2)
    with pytest.raises(ValueError, match="not both"):
        seqpar.attention(q, k, v, causal=True, mask="docs:3", ranks=2)
    o_text = seqpar.attention(q, k, v, mask="window:-1,0", ranks=2)  # the same mask as text
    assert np.abs(o_text - seqpar.attention(q, k, v, causal=True, ranks=2)).max() <= 1e-12
