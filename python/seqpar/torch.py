"""seqpar for PyTorch: sequence-parallel attention with autograd, in flash-attn's conventions.

    o = seqpar.torch.attention(q, k, v, causal=True, group=group)       # local shards
    o = seqpar.torch.attention(q, k, v, causal=True, ranks=4)           # full sequences
    o = seqpar.torch.attention(q, k, v, causal=True, cu_seqlens=offsets, group=group)  # documents

q [B, S, H, D], k and v [B, S, H_kv, D] (H divisible by H_kv); o like q; lse [B, H, S].
With `group` (a torch.distributed process group) q, k, v are this process's shard of the
sequence under `layout` (make them with seqpar.torch.shard) and `algo` runs over the group:
CPU tensors (float32/64) travel over the group's gloo transport, CUDA tensors (bfloat16/16)
over seqpar's NCCL communicator, bootstrapped from the group's store, on the current stream.
Without a group the tensors hold the full sequence and `ranks` thread ranks of this process
compute it (on the host, or sharing the tensors' GPU). Tensors cross into the C++ core through
DLPack; no PyTorch headers are compiled. The op is a torch.library custom op
(seqpar::attention_forward / _backward), so torch.compile(fullgraph=True) keeps it whole.
Needs torch; `import seqpar` alone does not.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import algorithm_spec
from . import torch_ops  # noqa: F401  (registers torch.ops.seqpar.*)
from .torch_layout import document_offsets, gather, positions, shard, unshard

__all__ = ["attention", "shard", "unshard", "gather", "positions"]


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D [batch, seq, heads, head_dim]; got shape {tuple(t.shape)}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              window_size: Tuple[int, int] = (-1, -1), softmax_scale: Optional[float] = None,
              return_lse: bool = False, algo: str = "auto", group=None, layout: str = "zigzag",
              seq_len: Optional[int] = None, ranks: Optional[int] = None,
              window: Optional[Tuple[int, int]] = None, scale: Optional[float] = None,
              ulysses: int = 0, ring_algo: Optional[str] = None, cu_seqlens=None, mask: Optional[str] = None):
    """Exact softmax attention, sequence parallel, differentiable in q, k and v.

    causal / window_size: flash-attn's mask; window_size=(left, right) keys around the
    diagonal, -1 unbounded; causal=True sets right to 0. softmax_scale defaults to 1/sqrt(D).
    algo: "auto" or a name from seqpar.algorithms() (for "ulysses-ring": ulysses, the Ulysses
    degree, 0 for the largest the heads allow, and ring_algo across the groups). layout: "zigzag", "striped",
    "contiguous" or "documents", how the sequence is split ("documents": every rank about the same
    visible work of cu_seqlens' documents; shard with the same cu_seqlens, seqpar.torch.shard(x,
    layout="documents", cu_seqlens=...)). group: a torch.distributed group; q, k, v are then
    this rank's shard and seq_len the global length (default: the ranks' local lengths summed,
    at the cost of one small exchange per call). Without a group: ranks thread ranks (default 2).
    window and scale are accepted as older names of window_size and softmax_scale.
    cu_seqlens: packed documents, flash-attn's varlen convention: the global start offset of
    each document and the total length (a 1-D integer tensor or a sequence of ints: [0, 5, 12,
    20] is three documents); a query sees keys of its own document only, under causal /
    window_size inside it. Offsets are global positions (with a group: of the whole sequence,
    not of this rank's shard). mask: any mask of `seqpar attn --mask` as text instead of the
    window ("bigbird:W,G,R[,B=N]", "bigbird-causal:...", "blocks:PATH", "blocks-causal:PATH",
    "docs:N", "window:L,R", "causal", "full").

    Returns o, or (o, lse) with return_lse (lse carries no gradient). Problems seqpar cannot
    run raise ValueError or TypeError with the reason; a failed transfer raises RuntimeError.
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(t, name)
    if window is not None:
        window_size = window
    if scale is not None:
        softmax_scale = scale
    if isinstance(window_size, (str, bytes)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right); got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    if softmax_scale is not None and not float(softmax_scale) > 0:
        raise ValueError(f"softmax_scale must be positive; got {softmax_scale}")
    if not isinstance(algo, str) or not isinstance(layout, str):
        raise TypeError("algo and layout must be strings")
    algo = algorithm_spec(algo, ulysses, ring_algo)
    doc_offsets = list(document_offsets(cu_seqlens))
    if mask is not None and not isinstance(mask, str):
        raise TypeError(f"mask must be a string (parse_mask's text); got {type(mask).__name__}")
    if mask and (causal or tuple(window_size) != (-1, -1)):
        raise ValueError("give the mask either as causal / window_size or as mask text, not both")
    if group is not None:
        size = torch.distributed.get_world_size(group)
        if ranks is not None and int(ranks) != size:
            raise ValueError(f"ranks={ranks} but the group has {size} ranks")
        group_name, n = group.group_name, size
    else:
        group_name, n = "", 2 if ranks is None else ranks
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"ranks must be an int; got {type(n).__name__}")
        if seq_len is not None and int(seq_len) != q.shape[1]:
            raise ValueError(f"without a group q holds the whole sequence ({q.shape[1]} tokens); seq_len={seq_len}")
    # Contiguous here, not inside the op, so that autograd saves the copies the op reads and the
    # backward does not make them again (transformers hands over [B, H, S, D] tensors' views).
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    o, lse = torch.ops.seqpar.attention_forward(
        q, k, v, left, right, 0.0 if softmax_scale is None else float(softmax_scale), algo, layout,
        0 if seq_len is None else int(seq_len), group_name, int(n), doc_offsets, mask or "")
    return (o, lse) if return_lse else o
