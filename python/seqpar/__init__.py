"""seqpar: exact distributed (sequence-parallel) attention, from Python.

Array-level API over the C++ library: the full-sequence arrays are split over P thread ranks
with a layout, the chosen algorithm's schedule runs on those ranks (CPU, float32 or float64),
and the results are put back together. Shapes follow flash-attn: q, dout [B, S, H, D];
k, v [B, S, H_kv, D] (H divisible by H_kv); lse [B, H, S].
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from . import _core

__version__: str = _core.__version__
__all__ = ["attention", "attention_backward", "algorithms", "algorithm_spec", "layouts", "shard", "unshard", "positions",
           "__version__"]

_LAYOUTS = ("contiguous", "zigzag", "striped", "documents")


def _array(x, name: str):
    # nanobind takes numpy arrays and anything with DLPack or the buffer protocol; say so
    # plainly for anything else (a list would otherwise fail with a signature dump).
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    raise TypeError(f"{name} must be an array (numpy or DLPack), not {type(x).__name__}")


def algorithm_spec(algo: str, ulysses: int = 0, ring_algo: Optional[str] = None) -> str:
    """The algorithm string _core takes: the name, with ulysses-ring's options appended
    ("ulysses-ring:ulysses=2,ring=burst"); the core checks it."""
    if not isinstance(algo, str):
        raise TypeError("algo must be a string")
    if isinstance(ulysses, bool) or not isinstance(ulysses, (int, np.integer)) or ulysses < 0:
        raise ValueError(f"ulysses must be a degree >= 0 (0: the algorithm chooses); got {ulysses!r}")
    if ring_algo is not None and not isinstance(ring_algo, str):
        raise TypeError("ring_algo must be a string")
    extra = ([f"ulysses={int(ulysses)}"] if ulysses else []) + ([f"ring={ring_algo}"] if ring_algo else [])
    return algo + (":" + ",".join(extra) if extra else "")


def _offsets(cu_seqlens) -> list:
    """cu_seqlens (packed documents' start offsets and the total) as a list of ints; [] for none."""
    if cu_seqlens is None:
        return []
    values = np.asarray(cu_seqlens)
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise TypeError("cu_seqlens must be a 1-D sequence of integers (the documents' start offsets and the total)")
    return [int(x) for x in values]


def _options(causal, window, algo, ranks, layout, scale, ulysses=0, ring_algo=None, cu_seqlens=None, mask=None):
    """The mask, algorithm and layout arguments as _core takes them, checked."""
    if isinstance(window, (str, bytes)) or len(window) != 2:
        raise ValueError(f"window must be a pair (left, right); got {window!r}")
    left, right = (int(w) for w in window)
    if causal:
        right = 0
    if not isinstance(algo, str) or not isinstance(layout, str):
        raise TypeError("algo and layout must be strings")
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)):
        raise TypeError(f"ranks must be an int; got {type(ranks).__name__}")
    if scale is not None and not float(scale) > 0:
        raise ValueError(f"scale must be positive; got {scale}")
    if mask is not None and not isinstance(mask, str):
        raise TypeError(f"mask must be a string (parse_mask's text); got {type(mask).__name__}")
    return dict(window_left=left, window_right=right, algo=algorithm_spec(algo, ulysses, ring_algo),
                ranks=int(ranks), layout=layout, scale=0.0 if scale is None else float(scale),
                doc_offsets=_offsets(cu_seqlens), mask=mask or "")


def attention(q, k, v, *, causal: bool = False, window: Tuple[int, int] = (-1, -1),
              algo: str = "auto", ranks: int = 2, layout: str = "zigzag",
              scale: Optional[float] = None, return_lse: bool = False, dout=None,
              ulysses: int = 0, ring_algo: Optional[str] = None, cu_seqlens=None, mask: Optional[str] = None):
    """Exact attention of the full sequence, computed by `algo` over `ranks` thread ranks.

    q: [B, S, H, D], k and v: [B, S, H_kv, D], one dtype (float32 or float64), C-contiguous.
    causal / window: flash-attn's mask convention; window=(left, right) keys around the
    diagonal, -1 unbounded; causal=True sets right to 0.
    algo: "auto" or a name from algorithms(); layout: one of layouts() ("documents" balances
    the visible work of the packed documents, cu_seqlens or docs:N; one document without). For "ulysses-ring",
    ulysses: the Ulysses degree (0: the largest the heads allow) and ring_algo: the ring-family
    algorithm across the groups (default "ring").
    scale: softmax scale, default 1/sqrt(D).
    cu_seqlens: packed documents (flash-attn's varlen offsets: [0, 5, 12, 20] is three
    documents); a query sees keys of its own document only, under causal / window inside it.
    mask: any mask of `seqpar attn --mask` as text instead of the window ("bigbird:1,1,2",
    "blocks-causal:PATH", "docs:8", ...).

    Returns o [B, S, H, D], or (o, lse) with return_lse (lse [B, H, S], natural log of the
    scaled scores). With dout (q's shape) it runs the backward too and returns
    (o, dq, dk, dv), or (o, lse, dq, dk, dv) with return_lse.
    Raises ValueError / TypeError with the reason for arguments it cannot run.
    """
    opts = _options(causal, window, algo, ranks, layout, scale, ulysses, ring_algo, cu_seqlens, mask)
    res = _core.attention(_array(q, "q"), _array(k, "k"), _array(v, "v"),
                          None if dout is None else _array(dout, "dout"), **opts)
    head = (res["o"], res["lse"]) if return_lse else (res["o"],)
    if dout is not None:
        return head + (res["dq"], res["dk"], res["dv"])
    return head if return_lse else res["o"]


def attention_backward(q, k, v, o, lse, dout, *, causal: bool = False,
                       window: Tuple[int, int] = (-1, -1), algo: str = "auto", ranks: int = 2,
                       layout: str = "zigzag", scale: Optional[float] = None,
                       ulysses: int = 0, ring_algo: Optional[str] = None, cu_seqlens=None, mask: Optional[str] = None):
    """The backward alone, against o and lse of a forward with the same mask and scale:
    returns (dq, dk, dv). Arguments as attention(); o: [B, S, H, D], lse: [B, H, S]."""
    opts = _options(causal, window, algo, ranks, layout, scale, ulysses, ring_algo, cu_seqlens, mask)
    arrays = [_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"), (dout, "dout"))]
    res = _core.attention_backward(*arrays, **opts)
    return res["dq"], res["dk"], res["dv"]


def algorithms() -> dict:
    """The distributed algorithms by name, each with a one-line summary ("auto" picks one)."""
    return _core.algorithms()


def layouts() -> Tuple[str, ...]:
    """The layout names: how a sequence is split over ranks. "documents" splits packed documents
    (give their cu_seqlens to shard, unshard and positions too) so that every rank has about the
    same visible work; the others balance tokens."""
    return _LAYOUTS


def shard(x, layout: str, ranks: int, rank: int, seq_dim: int = 1, cu_seqlens=None) -> np.ndarray:
    """Rank `rank`'s rows of x (a new array), the sequence along seq_dim (default 1, BSHD).
    cu_seqlens: the documents the "documents" layout balances (the attention call's)."""
    return _core.shard(_array(x, "x"), layout, ranks, rank, seq_dim, _offsets(cu_seqlens))


def unshard(shards: Sequence, layout: str, seq_dim: int = 1, cu_seqlens=None) -> np.ndarray:
    """The full array from every rank's shard (shards[r] from rank r; ranks = len(shards))."""
    if isinstance(shards, np.ndarray) or not isinstance(shards, (list, tuple)):
        raise TypeError("shards must be a list with one array per rank")
    return _core.unshard([_array(s, f"shards[{i}]") for i, s in enumerate(shards)], layout, seq_dim,
                         _offsets(cu_seqlens))


def positions(layout: str, seq_len: int, ranks: int, rank: int, cu_seqlens=None) -> list:
    """Global token positions of rank `rank`'s rows, in local order (for RoPE, labels)."""
    return _core.positions(layout, seq_len, ranks, rank, _offsets(cu_seqlens))
