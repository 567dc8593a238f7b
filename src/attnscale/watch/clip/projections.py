"""Where an attention module's W_q and W_k keep each head: the rows QK-Clip scales.

A head's q is a block of ``head_dim`` outputs of the query projection (and its k
a block of the key projection), so scaling that block of the weight's outputs and
of the bias by a factor scales the head's q (or k) by the same factor, before
RoPE, which is a rotation and commutes with it. Found by name on the module that
made the call or, where it has none, on the nearest module above it that has
them (torchtitan's ``attention.wq`` beside the kernel in ``attention.inner_attention``):

- separate projections: ``q_proj``/``k_proj`` (Llama, Mistral, Qwen, attnscale's
  own ``Attention``, ...), ``query``/``key`` (BERT), ``wq``/``wk`` (Meta's Llama,
  torchtitan), ``q``/``k`` (T5);
- one fused projection, q's outputs first, then k's, then v's: ``c_attn`` (nanoGPT,
  GPT-2), ``qkv`` (timm), ``qkv_proj`` (Phi-3), ``Wqkv`` (MPT);
- ``nn.MultiheadAttention``'s ``in_proj_weight``/``in_proj_bias`` (q, k, v stacked),
  or its ``q_proj_weight``/``k_proj_weight`` where the keys have their own width
  (``kdim``), their biases still in ``in_proj_bias``.

``nn.Linear`` keeps its outputs along dim 0 of the weight; transformers' ``Conv1D``
(GPT-2) along dim 1. Weights sharded by FSDP2 (DTensors) are scaled shard by shard. A module that normalises q or k after the projection (a
``q_norm``/``k_norm`` that is not an ``Identity``, or attnscale's qk-norm scale)
is refused: the norm would undo the scaling, so QK-Clip cannot act there.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    bias_start: int | None = None  # where the bias keeps the head's outputs, if not at ``start``

    def scale_(self, factor_N: torch.Tensor) -> None:
        """Multiply head n's rows of the weight and bias by ``factor_N[n]``, in place."""
        with torch.no_grad():
            bias_start = self.start if self.bias_start is None else self.bias_start
            for tensor, dim, start in ((self.weight, self.dim, self.start), (self.bias, 0, bias_start)):
                if tensor is None:
                    continue
                f = torch.ones(tensor.shape[dim], dtype=tensor.dtype, device=factor_N.device)
                f[start:start + self.heads * self.head_dim] = factor_N.to(tensor.dtype).repeat_interleave(self.head_dim)
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


def _holds(module: nn.Module) -> bool:
    """Whether ``module`` has any projection QK-Clip knows by name."""
    return (any(all(isinstance(getattr(module, a, None), nn.Module) for a in pair) for pair in PAIRS)
            or any(isinstance(getattr(module, a, None), nn.Module) for a in FUSED)
            or isinstance(getattr(module, "in_proj_weight", None), torch.Tensor)
            or isinstance(getattr(module, "q_proj_weight", None), torch.Tensor))


def _multihead(module: nn.Module, heads: int, head_dim: int, name: str) -> QKProjections | None:
    """``nn.MultiheadAttention``'s rows: q's outputs, then k's, in ``in_proj_weight`` (or in ``q_proj_weight`` and
    ``k_proj_weight``), the biases in ``in_proj_bias`` in the same order."""
    E = heads * head_dim
    if getattr(module, "bias_k", None) is not None:
        raise ConfigError(f"{name} has add_bias_kv: its learned key bias_k is no row of W_k, so QK-Clip cannot "
                          "scale every score of a head; leave qk_clip off for it")
    bias = getattr(module, "in_proj_bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None
    joint = getattr(module, "in_proj_weight", None)
    if isinstance(joint, torch.Tensor):
        if joint.ndim != 2 or joint.shape[0] != 3 * E:
            return None
        return QKProjections(HeadRows(joint, bias, 0, 0, heads, head_dim), HeadRows(joint, bias, 0, E, heads, head_dim))
    q_w, k_w = getattr(module, "q_proj_weight", None), getattr(module, "k_proj_weight", None)
    if not (isinstance(q_w, torch.Tensor) and isinstance(k_w, torch.Tensor)) or q_w.shape[0] != E or k_w.shape[0] != E:
        return None
    return QKProjections(HeadRows(q_w, bias, 0, 0, heads, head_dim), HeadRows(k_w, bias, 0, 0, heads, head_dim, E))


def _found(module: nn.Module, heads: int, head_dim: int, name: str) -> QKProjections | None:
    """The rows on ``module``, or None where the projections it has do not fit the call's heads."""
    for q_attr, k_attr in PAIRS:
        q_lin, k_lin = getattr(module, q_attr, None), getattr(module, k_attr, None)
        if isinstance(q_lin, nn.Module) and isinstance(k_lin, nn.Module):
            (qw, qb, qd), (kw, kb, kd) = _outputs(q_lin), _outputs(k_lin)
            kv_heads, extra = divmod(kw.shape[kd], head_dim)
            if qw.shape[qd] != heads * head_dim or extra or not kv_heads or heads % kv_heads:
                return None
            return QKProjections(HeadRows(qw, qb, qd, 0, heads, head_dim), HeadRows(kw, kb, kd, 0, kv_heads, head_dim))
    for attr in FUSED:
        fused = getattr(module, attr, None)
        if isinstance(fused, nn.Module):
            w, b, d = _outputs(fused)
            kv2, extra = divmod(w.shape[d] - heads * head_dim, head_dim)
            if extra or kv2 <= 0 or kv2 % 2 or heads % (kv2 // 2):
                return None
            start = heads * head_dim
            return QKProjections(HeadRows(w, b, d, 0, heads, head_dim), HeadRows(w, b, d, start, kv2 // 2, head_dim))
    return _multihead(module, heads, head_dim, name)


def qk_projections(chain: Sequence[tuple[str, nn.Module]], heads: int, head_dim: int) -> QKProjections:
    """Where each head's W_q and W_k rows are kept, for an attention call of ``heads`` query heads of width
    ``head_dim``: on the first module of ``chain`` ((name, module), the call's module first, then each one
    above it) that has projections QK-Clip knows; ConfigError naming the module where it cannot tell. A norm
    of q or k on any module up to that one is refused."""
    where = chain[0][0]
    for name, module in chain:
        _refuse_norms(module, name)
        if not _holds(module):
            continue
        rows = _found(module, heads, head_dim, name)
        if rows is None:
            raise ConfigError(f"QK-Clip cannot find the rows of {heads} heads of width {head_dim} in {name}: its "
                              "projections have other widths than the call's q and k; leave qk_clip off for this "
                              "model")
        return rows
    raise ConfigError(f"QK-Clip cannot find the rows of {heads} heads of width {head_dim} in {where} nor any module "
                      f"above it: it looks for {', '.join('/'.join(p) for p in PAIRS)}, a fused {', '.join(FUSED)} "
                      "projection (q's outputs, then k's, then v's) or nn.MultiheadAttention's in_proj_weight; leave "
                      "qk_clip off for this model")
