"""Capture from attnscale's own models (``core.attention.Attention``), through their hook points.

``capture_hooks`` hands every attention call to ``on_call`` as an ``AttentionCall``
(q and k as the scale prepares them, its factor and cap, the mask the model
applies), read as the call begins: the model keeps its fused path; ``capture_weights`` hands over the scores and weights the model
computes itself, for training's step measures on the step's own forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attnscale.capture.call import AttentionCall, OnCall
from attnscale.core.attention import Attention
from attnscale.core.hooks import hooked
from attnscale.core.scales import ScoreScale
from attnscale.errors import ConfigError

__all__ = ["attention_modules", "capture_hooks", "capture_weights"]


def attention_modules(model: nn.Module) -> list[tuple[str, Attention]]:
    """The attnscale ``Attention`` modules of ``model`` with their names, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]


def _hook(name: str, point: str) -> str:
    return f"{name}.hook_{point}" if name else f"hook_{point}"


@contextlib.contextmanager
def capture_hooks(model: nn.Module, on_call: OnCall) -> Iterator[None]:
    """attnscale's own models: q and k as each ``Attention`` makes them (``Attention.listen``), prepared as
    the scale prepares them (e.g. qk-norm), the scale's factor and cap, and the mask the model applies (its
    causal structure and the keys its ``key_padding_BT`` hides). Nothing needs the scores, so the model keeps
    its fused path (SDPA) where it has one."""
    attns = attention_modules(model)
    if not attns:
        raise ConfigError(f"{type(model).__name__} has no attnscale Attention module to read q and k from")

    def listener(name: str, m: Attention):
        custom = type(m.scale).cap is not ScoreScale.cap

        def fn(q_BHTD: torch.Tensor, k_BHTD: torch.Tensor, key_padding_BT: torch.Tensor | None) -> None:
            with torch.no_grad():
                q_BHTD, k_BHTD = m.scale.prepare(q_BHTD.detach(), k_BHTD.detach())
            mask = None if key_padding_BT is None else key_padding_BT.bool()[:, None, None, :]
            on_call(AttentionCall(q_BHTD, k_BHTD, scale=m.scale.factor(), mask=mask, is_causal=m.causal,
                                  softcap=getattr(m.scale, "cap_value", None), cap=m.scale.cap if custom else None,
                                  name=name, module=m))

        return fn

    handles = [m.listen(listener(n, m)) for n, m in attns]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def capture_weights(model: nn.Module, on_weights: Callable[[int, torch.Tensor, torch.Tensor], None]) -> Iterator[None]:
    """attnscale's own models: ``on_weights(layer, scores_BHTT, pattern_BHTT)`` with
    the scores (masked entries -inf) and weights each ``Attention`` computes
    itself, layer by layer (their order in the model), as they pass."""
    attns = attention_modules(model)
    if not attns:
        raise ConfigError(f"{type(model).__name__} has no attnscale Attention module to record")
    index = {_hook(n, p): i for i, (n, _) in enumerate(attns) for p in ("scores", "pattern")}
    scores: dict[int, torch.Tensor] = {}

    def fn(hook: str, tensor: torch.Tensor) -> None:
        layer = index[hook]
        if hook.endswith("hook_scores"):
            scores[layer] = tensor
        else:
            on_weights(layer, scores.pop(layer), tensor)

    with hooked(model, list(index), fn=fn):
        yield
