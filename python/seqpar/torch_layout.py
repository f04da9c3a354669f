"""Layout helpers for torch tensors: which global tokens a rank holds, and moving tensors (and
position ids, labels) between the full sequence and a rank's shard.

The positions come from seqpar's C++ Layout (`seqpar.positions`), so a shard made here is
exactly the one seqpar's schedules expect: contiguous (one run per rank), zigzag (2P chunks;
rank r holds chunks r and 2P-1-r), striped (token t on rank t mod P) and documents (packed
documents, given by their cu_seqlens, dealt whole or in per-document zigzag pieces so that every
rank has about the same visible work). Lengths need not divide evenly; earlier chunks take one
token more.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from . import _core

__all__ = ["positions", "shard", "unshard", "gather", "group_rank_and_size", "document_offsets"]


def document_offsets(cu_seqlens) -> tuple:
    """cu_seqlens (packed documents' start offsets and the total: a 1-D integer tensor or a
    sequence of ints) as a tuple of ints; () for none."""
    if cu_seqlens is None:
        return ()
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
            raise ValueError(f"cu_seqlens must be a 1-D integer tensor; got {cu_seqlens.dim()}-D {cu_seqlens.dtype}")
        return tuple(int(x) for x in cu_seqlens.tolist())
    try:
        return tuple(int(x) for x in cu_seqlens)
    except (TypeError, ValueError):
        raise TypeError("cu_seqlens must be a 1-D integer tensor or a sequence of ints") from None


@functools.lru_cache(maxsize=256)
def _positions_cpu(layout: str, seq_len: int, ranks: int, rank: int, doc_offsets: tuple) -> torch.Tensor:
    return torch.tensor(_core.positions(layout, int(seq_len), int(ranks), int(rank), list(doc_offsets)),
                        dtype=torch.long)


def group_rank_and_size(group, ranks: Optional[int], rank: Optional[int]):
    """(rank, ranks) from a torch.distributed group, or the explicit values."""
    if group is not None:
        import torch.distributed as dist
        g_rank, g_size = dist.get_rank(group), dist.get_world_size(group)
        if ranks is not None and int(ranks) != g_size:
            raise ValueError(f"ranks={ranks} but the group has {g_size} ranks")
        if rank is not None and int(rank) != g_rank:
            raise ValueError(f"rank={rank} but this process is rank {g_rank} of the group")
        return g_rank, g_size
    if ranks is None or rank is None:
        raise ValueError("give group= or both ranks= and rank=")
    return int(rank), int(ranks)


def positions(seq_len: int, *, layout: str = "zigzag", group=None, ranks: Optional[int] = None,
              rank: Optional[int] = None, device=None, cu_seqlens=None) -> torch.Tensor:
    """Global positions (int64) of this rank's tokens in local order: the position ids for RoPE
    and the indices of its labels. cu_seqlens: the packed documents the "documents" layout
    balances (the attention call's; the other layouts ignore them)."""
    r, p = group_rank_and_size(group, ranks, rank)
    pos = _positions_cpu(layout, int(seq_len), p, r, document_offsets(cu_seqlens))
    return pos if device is None else pos.to(device)


def shard(x: torch.Tensor, *, layout: str = "zigzag", group=None, ranks: Optional[int] = None,
          rank: Optional[int] = None, dim: int = 1, cu_seqlens=None) -> torch.Tensor:
    """This rank's rows of x (the full sequence along `dim`), a new contiguous tensor. Works on
    activations, input ids, position ids and labels alike (shift labels before sharding)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim {dim} is out of range for a {x.dim()}-D tensor")
    idx = positions(x.shape[dim], layout=layout, group=group, ranks=ranks, rank=rank, device=x.device,
                    cu_seqlens=cu_seqlens)
    return x.index_select(dim, idx)


def unshard(shards: Sequence[torch.Tensor], *, layout: str = "zigzag", dim: int = 1, cu_seqlens=None) -> torch.Tensor:
    """The full tensor from every rank's shard (shards[r] from rank r)."""
    if isinstance(shards, torch.Tensor) or not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError("shards must be a non-empty list with one tensor per rank")
    first = shards[0]
    dim = dim % first.dim()
    seq_len = sum(s.shape[dim] for s in shards)
    shape = list(first.shape)
    shape[dim] = seq_len
    out = first.new_empty(shape)
    for r, s in enumerate(shards):
        idx = positions(seq_len, layout=layout, ranks=len(shards), rank=r, device=s.device, cu_seqlens=cu_seqlens)
        if s.shape[dim] != idx.numel():
            raise ValueError(f"shards[{r}] has {s.shape[dim]} rows along dim {dim}; rank {r} of {len(shards)} "
                             f"holds {idx.numel()} of {seq_len} under the {layout} layout")
        out.index_copy_(dim, idx, s)
    return out


def gather(local: torch.Tensor, *, layout: str = "zigzag", group=None, dim: int = 1, cu_seqlens=None) -> torch.Tensor:
    """The full tensor on every rank of `group` from each rank's shard (an all-gather; shards
    of unequal length are padded for the transfer)."""
    import torch.distributed as dist
    p = dist.get_world_size(group)
    dim = dim % local.dim()
    lengths = torch.tensor([local.shape[dim]], device=local.device)
    all_lengths = [torch.zeros_like(lengths) for _ in range(p)]
    dist.all_gather(all_lengths, lengths, group=group)
    lens = [int(n.item()) for n in all_lengths]
    width = max(lens)
    pad = list(local.shape)
    pad[dim] = width - local.shape[dim]
    padded = torch.cat([local, local.new_zeros(pad)], dim=dim).contiguous()
    parts = [torch.empty_like(padded) for _ in range(p)]
    dist.all_gather(parts, padded, group=group)
    return unshard([t.narrow(dim, 0, n) for t, n in zip(parts, lens)], layout=layout, dim=dim, cu_seqlens=cu_seqlens)
