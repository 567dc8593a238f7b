"""Where an attention module's W_q and W_k keep each head: the rows QK-Clip scales.

A head's q is a block of ``head_dim`` outputs of the query projection (and its k
a block of the key projection), so scaling that block of the weight's outputs and
of the bias by a factor scales the head's q (or k) by the same factor, before
RoPE, which is a rotation and commutes with it. Found on the module by name:

- separate projections: ``q_proj``/``k_proj`` (Llama, Mistral, Qwen, attnscale's
  own ``Attention``, ...), ``query``/``key`` (BERT), ``wq``/``wk`` (Meta's Llama,
  torchtitan), ``q``/``k`` (T5);
- one fused projection, q's outputs first, then k's, then v's: ``c_attn`` (nanoGPT,
  GPT-2), ``qkv`` (timm), ``qkv_proj`` (Phi-3), ``Wqkv`` (MPT).

``nn.Linear`` keeps its outputs along dim 0 of the weight; transformers' ``Conv1D``
(GPT-2) along dim 1. Weights sharded by FSDP2 (DTensors) are scaled shard by shard. A module that normalises q or k after the projection (a
``q_norm``/``k_norm`` that is not an ``Identity``, or attnscale's qk-norm scale)
is refused: the norm would undo the scaling, so QK-Clip cannot act there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnscale.core.attention import Attention
from attnscale.core.scales import ScoreScale
from attnscale.errors import ConfigError

__all__ = ["HeadRows", "QKProjections", "qk_projections"]

PAIRS = (("q_proj", "k_proj"), ("query", "key"), ("wq", "wk"), ("q", "k"))
FUSED = ("c_attn", "qkv", "qkv_proj", "Wqkv")
NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm", "key_norm")


@dataclass(frozen=True, eq=False)  # tensors inside: compared by identity
class HeadRows:
    """``heads`` blocks of ``head_dim`` outputs of one projection, from output ``start`` on; the weight keeps
    its outputs along ``dim``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    dim: int
    start: int
    heads: int
    head_dim: int

    def scale_(self, factor_N: torch.Tensor) -> None:
        """Multiply head n's rows of the weight and bias by ``factor_N[n]``, in place."""
        with torch.no_grad():
            for tensor, dim in ((self.weight, self.dim), (self.bias, 0)):
                if tensor is None:
                    continue
                f = torch.ones(tensor.shape[dim], dtype=tensor.dtype, device=factor_N.device)
                f[self.start:self.start + self.heads * self.head_dim] = factor_N.to(tensor.dtype).repeat_interleave(self.head_dim)
                shape = [1] * tensor.ndim
                shape[dim] = -1
                tensor.mul_(_like(f.view(shape), tensor))


def _like(f: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``f`` where it multiplies ``tensor``: on its device, or for a sharded DTensor (FSDP2) as a DTensor on
    its mesh, split where ``tensor`` is split along the dims ``f`` spans, so each rank scales its own rows."""
    if type(tensor).__name__ != "DTensor":  # told without importing torch.distributed, which a build may lack
        return f.to(tensor.device)
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    placements = [p if isinstance(p, Shard) and f.shape[p.dim] == tensor.shape[p.dim] else Replicate()
                  for p in tensor.placements]
    return distribute_tensor(f.to(tensor.to_local().device), tensor.device_mesh, placements)


@dataclass(frozen=True)
class QKProjections:
    """The query heads' rows and the key heads' rows of one attention module."""

    q: HeadRows
    k: HeadRows


def _outputs(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(weight, bias, the weight's dim of outputs) of an ``nn.Linear`` or transformers' ``Conv1D``."""
    weight, bias = getattr(linear, "weight", None), getattr(linear, "bias", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise ConfigError(f"{type(linear).__name__} has no 2-D weight for QK-Clip to scale")
    return weight, bias if isinstance(bias, torch.Tensor) else None, 1 if type(linear).__name__ == "Conv1D" else 0


def _refuse_norms(module: nn.Module, name: str) -> None:
    for attr in NORMS:
        norm = getattr(module, attr, None)
        if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity):
            raise ConfigError(f"{name} normalises q or k after the projection ({attr}), which undoes any scaling "
                              "of W_q and W_k: QK-Clip cannot act there; leave qk_clip off for this model")
    if isinstance(module, Attention) and type(module.scale).prepare is not ScoreScale.prepare:
        raise ConfigError(f"{name} uses the score scale {type(module.scale).__name__}, which prepares q and k itself "
                          "(qk-norm) and undoes any scaling of W_q and W_k: leave qk_clip off for it")


def qk_projections(module: nn.Module, heads: int, head_dim: int, name: str = "") -> QKProjections:
    """Where ``module`` (an attention module whose calls have ``heads`` query heads of width ``head_dim``)
    keeps each head's W_q and W_k rows; ConfigError naming the module where it cannot tell."""
    name = name or type(module).__name__
    _refuse_norms(module, name)
    for q_attr, k_attr in PAIRS:
        q_lin, k_lin = getattr(module, q_attr, None), getattr(module, k_attr, None)
        if isinstance(q_lin, nn.Module) and isinstance(k_lin, nn.Module):
            (qw, qb, qd), (kw, kb, kd) = _outputs(q_lin), _outputs(k_lin)
            kv_heads, extra = divmod(kw.shape[kd], head_dim)
            if qw.shape[qd] != heads * head_dim or extra or not kv_heads or heads % kv_heads:
                break
            return QKProjections(HeadRows(qw, qb, qd, 0, heads, head_dim), HeadRows(kw, kb, kd, 0, kv_heads, head_dim))
    for attr in FUSED:
        fused = getattr(module, attr, None)
        if isinstance(fused, nn.Module):
            w, b, d = _outputs(fused)
            kv2, extra = divmod(w.shape[d] - heads * head_dim, head_dim)
            if extra or kv2 <= 0 or kv2 % 2 or heads % (kv2 // 2):
                break
            start = heads * head_dim
            return QKProjections(HeadRows(w, b, d, 0, heads, head_dim), HeadRows(w, b, d, start, kv2 // 2, head_dim))
    raise ConfigError(f"QK-Clip cannot find the rows of {heads} heads of width {head_dim} in {name}: it looks for "
                      f"{', '.join('/'.join(p) for p in PAIRS)} or a fused {', '.join(FUSED)} projection "
                      "(q's outputs, then k's, then v's); leave qk_clip off for this model")
