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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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


_config = _Config()


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
    o = seqpar_torch.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                               window_size=window, softmax_scale=scaling, algo=_config.algo, group=_config.group,
                               ranks=_config.ranks, layout=_config.layout,
                               seq_len=_config.seq_len if _config.group is not None else None)
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
                layout: Optional[str] = None, ranks: Optional[int] = None, rank: Optional[int] = None) -> dict:
    """This rank's share of a batch of whole sequences [B, S], as keyword arguments for a
    transformers causal LM: input_ids, position_ids (global positions), use_cache=False, and
    with labels the
    targets already shifted on the whole sequence (labels = shift_labels) and
    num_items_in_batch, the global count of targets, so the rank's loss is its part of the mean."""
    layout = layout or _config.layout
    r, p = group_rank_and_size(group, ranks, rank)
    _config.seq_len = input_ids.shape[1]  # the attention calls of this batch need not agree on it
    pos = seqpar_torch.positions(input_ids.shape[1], layout=layout, ranks=p, rank=r, device=input_ids.device)
    out = {"input_ids": input_ids.index_select(1, pos),
           "position_ids": pos.unsqueeze(0).expand(input_ids.shape[0], -1), "use_cache": False}
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
