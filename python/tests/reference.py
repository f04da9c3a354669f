"""Plain numpy attention in float64, forward and backward: the oracle the Python tests use.

Shapes as in seqpar: q, dout [B, S, H, D]; k, v [B, S, H_kv, D]; lse [B, H, S]. Query head h
reads key/value head h // (H // H_kv). window (left, right): key j is visible from query i when
i - left <= j <= i + right, -1 meaning unbounded on that side.
"""
import numpy as np


def visible(seq, left, right):
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    ok = np.ones((seq, seq), dtype=bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention(q, k, v, dout=None, window=(-1, -1), scale=None):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, S, H, D = q.shape
    groups = H // k.shape[2]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    kr, vr = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kr) * scale
    s = np.where(visible(S, *window), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + m)[..., 0]
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    o = np.einsum("bhij,bjhd->bihd", p, vr)
    out = {"o": o, "lse": np.ascontiguousarray(lse)}
    if dout is not None:
        do = np.asarray(dout, dtype=np.float64)
        dp = np.einsum("bihd,bjhd->bhij", do, vr)
        delta = np.einsum("bihd,bihd->bhi", do, o)
        ds = p * (dp - delta[..., None])
        out["dq"] = np.einsum("bhij,bjhd->bihd", ds, kr) * scale
        dk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
        dv = np.einsum("bhij,bihd->bjhd", p, do)
        hk = k.shape[2]
        out["dk"] = dk.reshape(B, S, hk, groups, D).sum(axis=3)
        out["dv"] = dv.reshape(B, S, hk, groups, D).sum(axis=3)
    return out
