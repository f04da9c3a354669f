"""seqpar for PyTorch: seqpar.torch.attention, differentiable, on CPU tensors.

Tensors cross into the C++ core through DLPack (no PyTorch headers in seqpar); the results
come back as tensors sharing the arrays' memory. The forward keeps o and lse, and the backward
runs the algorithm's backward schedule alone against them (seqpar.attention_backward), as
flash-attn's autograd functions do. Needs torch; `import seqpar` alone does not.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _core, _options

__all__ = ["attention"]


def _host(t: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{name} is on {t.device}; seqpar's Python API computes on CPU tensors")
    # The core reads C-contiguous memory: torch's own contiguous() copies when needed.
    return t.detach().contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts):
        q, k, v = _host(q, "q"), _host(k, "k"), _host(v, "v")
        res = _core.attention(q, k, v, None, **opts)
        o, lse = torch.from_numpy(res["o"]), torch.from_numpy(res["lse"])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.opts = opts
        # Gradients flow through o alone; a loss on lse would need dLSE, which seqpar lacks.
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        res = _core.attention_backward(q, k, v, o, lse, _host(dout, "dout"), **ctx.opts)
        return torch.from_numpy(res["dq"]), torch.from_numpy(res["dk"]), torch.from_numpy(res["dv"]), None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              window: Tuple[int, int] = (-1, -1), algo: str = "auto", ranks: int = 2,
              layout: str = "zigzag", scale: Optional[float] = None, return_lse: bool = False):
    """seqpar.attention on torch tensors (float32/float64, CPU), with autograd: q [B, S, H, D],
    k, v [B, S, H_kv, D]. Returns o, or (o, lse) with return_lse (lse [B, H, S] carries no
    gradient). Arguments as seqpar.attention."""
    opts = _options(causal, window, algo, ranks, layout, scale)
    o, lse = _Attention.apply(q, k, v, opts)
    return (o, lse) if return_lse else o
