"""Transformer Engine's own largest score: read from its ``DotProductAttention`` where the model asked for it.

TE's ``DotProductAttention(..., return_max_logit=True)`` returns ``(output, max_logit)``: per head (H,), the
largest of mask(Q·Kᵀ × softmax_scale + bias) over the batch, as its kernels computed it (Megatron-LM's
``--qk-clip`` and ``--log-max-attention-logit`` read it). ``capture_te_max`` hooks each such module of a model
(a class named ``DotProductAttention`` from ``transformer_engine``) and hands ``take(call, max_H)`` after each
forward: the call as an ``AttentionCall`` (q and k read in the module's ``qkv_format``: "sbhd", TE's default,
"bshd" or "thd") and the H numbers. A module built without ``return_max_logit`` is left alone (turning it on
would change what the model gets back), and so is a model without Transformer Engine: nothing is imported.
A call with a bias (``core_attention_bias_type`` other than "no_bias", or ``alibi_slopes``) is a ConfigError:
the bias is in TE's number, and a bias is no score.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attnscale.capture.call import AttentionCall
from attnscale.errors import ConfigError

__all__ = ["capture_te_max", "te_modules"]


def te_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The Transformer Engine ``DotProductAttention`` modules of ``model`` that return their max logit, by name."""
    return [(n, m) for n, m in model.named_modules()
            if type(m).__name__ == "DotProductAttention" and type(m).__module__.startswith("transformer_engine.")
            and getattr(m, "return_max_logit", False)]


def _heads_first(x: torch.Tensor, layout: str) -> torch.Tensor:
    """q or k in TE's ``layout`` as B×H×T×D."""
    if layout == "sbhd":
        return x.permute(1, 2, 0, 3)
    if layout == "bshd":
        return x.transpose(1, 2)
    if layout == "thd":
        return x.transpose(0, 1)[None]
    raise ConfigError(f"QK-Clip reads Transformer Engine's qkv_format sbhd, bshd or thd, got {layout!r}")


def _te_call(module: nn.Module, name: str, args: tuple, kwargs: dict) -> AttentionCall:
    query = args[0] if args else kwargs.get("query_layer")
    key = args[1] if len(args) > 1 else kwargs.get("key_layer")
    if kwargs.get("core_attention_bias_type", "no_bias") != "no_bias" or kwargs.get("alibi_slopes") is not None:
        raise ConfigError(f"Transformer Engine's max_logit of {name!r} includes its attention bias, which is no score "
                          "and which no scaling of W_q and W_k can shrink; train it without qk_clip, or without the bias")
    layout = kwargs.get("qkv_format") or getattr(module, "qkv_format", None) or "sbhd"
    return AttentionCall(_heads_first(query, layout), _heads_first(key, layout),
                         scale=getattr(module, "softmax_scale", None), name=name, module=module)


@contextlib.contextmanager
def capture_te_max(model: nn.Module, take: Callable[[AttentionCall, torch.Tensor], None]) -> Iterator[int]:
    """Hand ``take(call, max_H)`` after each forward of every ``te_modules(model)``; yields how many are hooked.
    The hooks are removed on exit, even on error."""
    found = te_modules(model)

    def hook(name: str):
        def read(module, args, kwargs, output) -> None:
            if isinstance(output, (tuple, list)) and len(output) >= 2 and torch.is_tensor(output[-1]):
                take(_te_call(module, name, tuple(args), dict(kwargs)), output[-1].detach())

        return read

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in found]
    try:
        yield len(found)
    finally:
        for h in handles:
            h.remove()
