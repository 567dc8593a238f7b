"""Capture from attnscale's own models (``core.attention.Attention``), through their hook points.

``capture_hooks`` hands every attention call to ``on_call`` as an ``AttentionCall``
(q and k as the scale prepares them, its factor and cap, the mask the model
applied); ``capture_weights`` hands over the scores and weights the model
computes itself, for training's step measures on the step's own forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attnscale.capture.call import AttentionCall, OnCall, hidden_keys
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
    """attnscale's own models: q and k from ``hook_q``/``hook_k`` (prepared as the
    scale prepares them, e.g. qk-norm), the scale's factor and cap, and the mask
    the model applied (the entries its ``hook_scores`` holds as -inf, ``hidden_keys``)."""
    attns = attention_modules(model)
    if not attns:
        raise ConfigError(f"{type(model).__name__} has no attnscale Attention module to read q and k from")
    module_of = {_hook(n, p): (n, m) for n, m in attns for p in ("q", "k", "scores")}
    seen: dict[tuple[str, str], torch.Tensor] = {}

    def fn(hook: str, tensor: torch.Tensor) -> None:
        name, m = module_of[hook]
        point = hook.rsplit("_", 1)[-1]
        if point != "scores":
            seen[(name, point)] = tensor
            return
        q_BHTD, k_BHTD = m.scale.prepare(seen.pop((name, "q")), seen.pop((name, "k")))
        custom = type(m.scale).cap is not ScoreScale.cap
        on_call(AttentionCall(q_BHTD, k_BHTD, scale=m.scale.factor(), mask=~hidden_keys(tensor),
                              softcap=getattr(m.scale, "cap_value", None), cap=m.scale.cap if custom else None, name=name,
                              module=m))

    with hooked(model, list(module_of), fn=fn):
        yield


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
