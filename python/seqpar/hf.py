"""seqpar as a Hugging Face transformers attention implementation.

    import seqpar.hf
    seqpar.hf.register(group=group, layout="zigzag")            # or ranks=4 without a group
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="seqpar")
    batch = seqpar.hf.shard_batch(input_ids, labels, group=group, layout="zigzag")
    loss = model(**batch).loss                                    # this rank's share of the mean
    loss.backward(); seqpar.hf.all_reduce_gradients(model, group)

register() adds "seqpar" to transformers' AttentionInterface: every attention layer then calls
seqpar.torch.attention on its query/key/value (transformers hands them as [B, H, S, D]; seqpar
takes [B, S, H, D] views of them). With a group each process holds its shard of every sequence
under the layout: shard_batch gives it its input ids, its global position ids (RoPE) and its
targets, shifted on the full sequence before sharding so that none is lost at a shard
boundary, with the global target count so that the per-rank losses sum to the full mean. Without
a group the model sees whole sequences and seqpar splits each attention call over thread ranks.
transformers builds no attention mask for an implementation it does not know, and seqpar
needs none: causal and sliding-window masks come from the layer; padding masks are refused.
Packed documents come as transformers' own packed path reads them: position_ids restarting at 0
at each document of a single row (DataCollatorWithFlattening's form); a query then sees its own
document alone. With a group, give shard_batch the whole row's position_ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from . import torch as seqpar_torch
from .torch_layout import group_rank_and_size

__all__ = ["register", "attention_forward", "shard_batch", "all_reduce_gradients", "NAME"]

NAME = "seqpar"
IGNORE_INDEX = -100


@dataclass
class _Config:
    group: object = None
    ranks: Optional[int] = None
    layout: str = "zigzag"
    algo: str = "auto"
    seq_len: Optional[int] = None
    cu_seqlens: Optional[List[int]] = None  # the sharded batch's documents (shard_batch)


_config = _Config()


def _documents(position_ids: Optional[torch.Tensor]) -> Optional[List[int]]:
    """Packed documents from position ids that restart at 0, as cu_seqlens offsets (the start
    of each document and the row's length); None where the positions never go back (one
    document a row)."""
    if position_ids is None:
        return None
    pos = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
    if pos.shape[-1] < 2 or bool((pos[:, 1:] >= pos[:, :-1]).all()):
        return None
    if pos.shape[0] != 1:
        raise ValueError("packed position_ids (restarting at 0 per document) take a batch of one row, as "
                         f"transformers' packed path; got {pos.shape[0]} rows")
    starts = (pos[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("packed position_ids must start every document at 0, the first at index 0")
    return starts + [int(pos.shape[1])]


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, sliding_window: Optional[int] = None, **kwargs):
    """transformers' attention-function signature: query [B, H, S, D], key/value [B, H_kv, S, D]
    in, ([B, S, H, D], None) out."""
    if attention_mask is not None:
        raise ValueError("seqpar attention takes no attention mask (padding); pack sequences without padding "
                         "or use attention_mask=None")
    if dropout:
        raise ValueError("seqpar attention has no dropout; set the model's attention_dropout to 0")
    if kwargs.get("softcap") is not None:
        raise ValueError("seqpar attention has no logit softcap")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (sliding_window - 1, -1) if sliding_window else (-1, -1)
    # Packed documents: with a group the sharded batch's (its rows' positions are local), else
    # from the call's position ids.
    documents = _config.cu_seqlens if _config.group is not None else _documents(kwargs.get("position_ids"))
    o = seqpar_torch.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                               window_size=window, softmax_scale=scaling, algo=_config.algo, group=_config.group,
                               ranks=_config.ranks, layout=_config.layout,
                               seq_len=_config.seq_len if _config.group is not None else None,
                               cu_seqlens=documents)
    return o, None


def register(*, group=None, ranks: Optional[int] = None, layout: str = "zigzag", algo: str = "auto",
             seq_len: Optional[int] = None) -> str:
    """Registers (or reconfigures) the "seqpar" attention implementation and returns its name.
    group: a torch.distributed group whose ranks each hold a shard of every sequence of
    seq_len tokens; else ranks thread ranks (default 2)
    split each call over whole sequences. shard_batch sets seq_len for the batch it shards;
    without it the ranks agree on the length at each call."""
    from transformers import AttentionInterface
    if group is None and ranks is None:
        ranks = 2
    _config.group, _config.ranks, _config.layout, _config.algo, _config.seq_len = group, ranks, layout, algo, seq_len
    AttentionInterface.register(NAME, attention_forward)
    return NAME


def shard_batch(input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None, *, group=None,
                layout: Optional[str] = None, ranks: Optional[int] = None, rank: Optional[int] = None,
                position_ids: Optional[torch.Tensor] = None) -> dict:
    """This rank's share of a batch of whole sequences [B, S], as keyword arguments for a
    transformers causal LM: input_ids, position_ids (global positions, or this rank's of the
    given position_ids), use_cache=False, and with labels the
    targets already shifted on the whole sequence (labels = shift_labels) and
    num_items_in_batch, the global count of targets, so the rank's loss is its part of the mean.
    position_ids restarting at 0 mark packed documents (one row): the attention calls of this
    batch then keep each query within its document."""
    layout = layout or _config.layout
    r, p = group_rank_and_size(group, ranks, rank)
    _config.seq_len = input_ids.shape[1]  # the attention calls of this batch need not agree on it
    _config.cu_seqlens = _documents(position_ids)
    pos = seqpar_torch.positions(input_ids.shape[1], layout=layout, ranks=p, rank=r, device=input_ids.device)
    rope = pos.unsqueeze(0).expand(input_ids.shape[0], -1) if position_ids is None else position_ids.index_select(1, pos)
    out = {"input_ids": input_ids.index_select(1, pos), "position_ids": rope, "use_cache": False}
    if labels is not None:
        shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]
        local = shifted.index_select(1, pos)
        out.update(labels=local, shift_labels=local, num_items_in_batch=(shifted != IGNORE_INDEX).sum())
    return out


def all_reduce_gradients(model: torch.nn.Module, group=None) -> None:
    """Sums every parameter's gradient over the group: each rank's backward gives its share of
    the full sequence's gradient (seqpar's backward returns dK/dV to the ranks that own them)."""
    import torch.distributed as dist
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
