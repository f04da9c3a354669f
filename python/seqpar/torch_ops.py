"""seqpar's attention as PyTorch custom operators (torch.library), so that autograd and
torch.compile (fullgraph) see one opaque op each way instead of tracing into the binding:

  seqpar::attention_forward(q, k, v, ...) -> (o, lse)      (the mask: a window, documents'
                                                             offsets, or parse_mask's text)
  seqpar::attention_backward(dout, q, k, v, o, lse, ...) -> (dq, dk, dv)

Both run either over a torch.distributed group (group_name set; q, k, v are this rank's
shards) or over `ranks` thread ranks of this process (group_name ""; q, k, v are the full
sequences, sharded and put back here with the layout). CUDA tensors are computed on the
current CUDA stream. The forward saves o and lse; lse carries no gradient.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import _core
from . import torch_layout, torch_ranks

__all__ = ["attention_forward", "attention_backward"]


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _plain(t: torch.Tensor) -> torch.Tensor:
    # DLPack refuses tensors that require grad; the core reads C-contiguous memory.
    return t.detach().contiguous()


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float32 if q.is_cuda else q.dtype


def _run(tensors: List[Optional[torch.Tensor]], window_left: int, window_right: int, scale: float, algo: str,
         layout: str, seq_len: int, group_name: str, ranks: int, doc_offsets: List[int], mask: str) -> None:
    """Runs the forward (5 tensors: q, k, v, o, lse; o and lse written) or the backward (9: and
    dout, dq, dk, dv; the last three written) on the ranks these arguments name."""
    q = tensors[0]
    opts = dict(window_left=window_left, window_right=window_right, scale=scale, algo=algo, layout=layout,
                doc_offsets=list(doc_offsets), mask=mask)
    if group_name:
        group = torch.distributed.distributed_c10d._resolve_process_group(group_name)
        rank = torch_ranks.group_rank(group, q.device)
        try:
            if seq_len == 0:  # shards may differ in length: sum them (one small exchange)
                seq_len = rank.agree_seq_len(q.shape[1])
            _core.shard_attention(rank, *tensors[:5], *(tensors[5:] or [None] * 4), seq_len=seq_len,
                                  stream=_stream(q), **opts)
        except Exception:  # a failed rank aborted its communicator: the next call starts afresh
            torch_ranks.forget(group, 0, q.device)
            raise
        return
    # Thread ranks: shard the full tensors, run every rank, put the written ones back.
    full_len = q.shape[1]
    idx = [torch_layout.positions(full_len, layout=layout, ranks=ranks, rank=r, device=q.device, cu_seqlens=doc_offsets)
           for r in range(ranks)]
    if ranks == 1 and torch.equal(idx[0], torch.arange(full_len, device=q.device, dtype=idx[0].dtype)):
        # One rank holding the sequence in order: it reads and writes the tensors themselves (no
        # shard copies in and out).
        ranks_here = torch_ranks.thread_ranks(1, q.device)
        try:
            _core.threads_attention(ranks_here, [list(tensors)], seq_len=full_len, stream=_stream(q), **opts)
        except Exception:
            torch_ranks.forget(None, 1, q.device)
            raise
        return
    written = (3, 4) if len(tensors) == 5 else (6, 7, 8)
    shards = []
    for r in range(ranks):
        part = []
        for i, t in enumerate(tensors):
            dim = 2 if i == 4 else 1  # lse is [B, H, S]
            if i in written:
                shape = list(t.shape)
                shape[dim] = idx[r].numel()
                part.append(t.new_empty(shape))
            else:
                part.append(t.index_select(dim, idx[r]))
        shards.append(part)
    ranks_here = torch_ranks.thread_ranks(ranks, q.device)
    try:
        _core.threads_attention(ranks_here, shards, seq_len=full_len, stream=_stream(q), **opts)
    except Exception:  # a failed rank aborted its communicator: the next call starts afresh
        torch_ranks.forget(None, ranks, q.device)
        raise
    for i in written:
        dim = 2 if i == 4 else 1
        for r in range(ranks):
            tensors[i].index_copy_(dim, idx[r], shards[r][i])


@torch.library.custom_op("seqpar::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_left: int, window_right: int,
                      scale: float, algo: str, layout: str, seq_len: int, group_name: str,
                      ranks: int, doc_offsets: List[int], mask: str) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _plain(q), _plain(k), _plain(v)
    B, S, H, _ = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, S), dtype=_lse_dtype(q), device=q.device)
    _run([q, k, v, o, lse], window_left, window_right, scale, algo, layout, seq_len, group_name, ranks, doc_offsets,
         mask)
    return o, lse


@attention_forward.register_fake
def _(q, k, v, window_left, window_right, scale, algo, layout, seq_len, group_name, ranks, doc_offsets, mask):
    B, S, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, S), dtype=_lse_dtype(q))


@torch.library.custom_op("seqpar::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, window_left: int, window_right: int, scale: float, algo: str, layout: str,
                       seq_len: int, group_name: str, ranks: int, doc_offsets: List[int],
                       mask: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o, lse, dout = (_plain(t) for t in (q, k, v, o, lse, dout))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _run([q, k, v, o, lse, dout, dq, dk, dv], window_left, window_right, scale, algo, layout, seq_len, group_name,
         ranks, doc_offsets, mask)
    return dq, dk, dv


@attention_backward.register_fake
def _(dout, q, k, v, o, lse, window_left, window_right, scale, algo, layout, seq_len, group_name, ranks, doc_offsets,
      mask):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = inputs[3:]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout, q, k, v, o, lse, *ctx.options)
    return (dq, dk, dv) + (None,) * len(ctx.options)


attention_forward.register_autograd(_backward, setup_context=_setup_context)
