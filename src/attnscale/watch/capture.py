"""Capture: the q and k a model's attention uses, one ``AttentionCall`` per call.

Four sources, each a context manager that hands every attention call of one
forward pass to ``on_call`` and leaves nothing behind when it exits (even on
error):

- ``capture_hooks``: attnscale's own models (``core.attention.Attention``),
  through their hook points;
- ``capture_hf`` (in ``hf_capture.py``, imports transformers when entered):
  any Hugging Face model whose attention goes through transformers'
  ``AttentionInterface``, wrapping the model's own attention function;
- ``capture_sdpa`` (in ``sdpa_capture.py``): any model that calls
  ``torch.nn.functional.scaled_dot_product_attention``, intercepted for the
  duration of the probe;
- ``capture_adapter``: anything else, through an ``Adapter``: the names of the
  attention modules and a function that reads q, k, mask and scale from one
  module's forward.

``capture_weights`` is apart: it hands over the scores and weights an attnscale
model computes itself, for training's recording on the step's own forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscale.core.attention import Attention
from attnscale.core.hooks import record
from attnscale.core.scales import ScoreScale
from attnscale.errors import ConfigError

__all__ = ["Adapter", "AttentionCall", "OnCall", "as_visible", "attention_modules", "capture_adapter", "capture_hooks",
           "capture_weights"]


@dataclass(frozen=True, eq=False)  # tensors inside: compared by identity
class AttentionCall:
    """One attention call, as the model made it.

    ``q``: B×H×T×D, after anything done to it before the product (RoPE, q-norm);
    ``k``: B×K×S×D with K key/value heads (GQA: K divides H, and query head h
    reads key head h // (H / K), as ``repeat_kv`` and SDPA's ``enable_gqa`` do).
    ``scale``: the factor on q·kᵀ (None: 1/sqrt(D), SDPA's default).
    ``mask``: boolean, broadcastable to B×H×T×S, True where a query may see a
    key; None: every key. ``is_causal``: a causal mask on top of ``mask``
    (aligned top-left, as SDPA's). ``softcap``: c·tanh(s/c) after the scale;
    ``cap``: any other squash (it wins over ``softcap``). ``bias``: added to the
    scores after the cap (a position bias, the finite part of a float mask).
    ``name``: where the call came from, for the reader; ``module``: the module
    that made it, where the capture knows it."""

    q: torch.Tensor
    k: torch.Tensor
    scale: float | torch.Tensor | None = None
    mask: torch.Tensor | None = None
    is_causal: bool = False
    softcap: float | None = None
    cap: Callable[[torch.Tensor], torch.Tensor] | None = None
    bias: torch.Tensor | None = None
    name: str = ""
    module: Any = None

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def factor(self) -> float | torch.Tensor:
        return self.q.shape[-1] ** -0.5 if self.scale is None else self.scale

    def squash(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What the model does to the scaled scores before the mask, or None."""
        if self.cap is not None:
            return self.cap
        if self.softcap:
            return lambda s, c=float(self.softcap): c * torch.tanh(s / c)
        return None

    def visible(self) -> torch.Tensor | None:
        """``mask`` and ``is_causal`` in one boolean mask (None: every key counts)."""
        mask = self.mask
        if self.is_causal:
            T, S = self.q.shape[-2], self.k.shape[-2]
            causal = torch.ones(T, S, dtype=torch.bool, device=self.q.device).tril()[None, None]
            mask = causal if mask is None else mask.to(self.q.device) & causal
        return mask


OnCall = Callable[[AttentionCall], None]


def as_visible(mask: torch.Tensor | None, keep_bias: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A mask as SDPA and transformers take it (boolean, True = may attend, or an
    additive float mask, 0 or a bias where visible and -inf or the dtype's
    lowest where not) as (boolean mask, float bias or None). ``keep_bias=False``
    drops the bias (transformers' masks carry none)."""
    if mask is None or mask.dtype == torch.bool:
        return mask, None
    visible = mask > torch.finfo(mask.dtype).min / 2
    bias = torch.where(visible, mask, 0).float() if keep_bias else None
    return visible, bias


def attention_modules(model: nn.Module) -> list[tuple[str, Attention]]:
    """The attnscale ``Attention`` modules of ``model`` with their names, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]


def _hook(name: str, point: str) -> str:
    return f"{name}.hook_{point}" if name else f"hook_{point}"


@contextlib.contextmanager
def capture_hooks(model: nn.Module, on_call: OnCall) -> Iterator[None]:
    """attnscale's own models: q and k from ``hook_q``/``hook_k`` (prepared as the
    scale prepares them, e.g. qk-norm), the scale's factor and cap, and the mask
    the model applied (the entries its ``hook_scores`` holds as -inf)."""
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
        on_call(AttentionCall(q_BHTD, k_BHTD, scale=m.scale.factor(), mask=torch.isfinite(tensor[:, :1]),
                              softcap=getattr(m.scale, "cap_value", None), cap=m.scale.cap if custom else None, name=name,
                              module=m))

    with record(model, list(module_of), fn=fn):
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

    with record(model, list(index), fn=fn):
        yield


@dataclass(frozen=True)
class Adapter:
    """How to read the q and k of a model that none of the other captures reach.

    ``modules``: glob patterns of the attention modules' names
    (``model.named_modules()``), e.g. ``"blocks.*.attn"``. ``read(module, args,
    kwargs, output)`` is called after each matching module's forward, with what
    the forward took and gave, and returns either an ``AttentionCall`` or a tuple
    ``(q_BHTD, k_BKSD, mask, scale)``: mask as SDPA takes it (boolean, True =
    may attend, or additive float; None: every key), scale a float (None:
    1/sqrt(D)). It may return None to skip a call. Example, for a module that
    keeps its projections as ``qkv`` and its head count as ``n_head``::

        def read(m, args, kwargs, out):
            x = args[0]
            B, T, C = x.shape
            q, k, _ = m.qkv(x).view(B, T, 3, m.n_head, -1).permute(2, 0, 3, 1, 4)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            return q, k, causal, None

        watch.measure(model, ids, adapter=Adapter("blocks.*.attn", read))
    """

    modules: str | tuple[str, ...]
    read: Callable[[nn.Module, tuple, dict, Any], AttentionCall | tuple | None]


@contextlib.contextmanager
def capture_adapter(model: nn.Module, on_call: OnCall, adapter: Adapter) -> Iterator[None]:
    """Anything else: ``adapter.read`` on the forward of each module it names (a
    forward hook, removed on exit)."""
    patterns = [adapter.modules] if isinstance(adapter.modules, str) else list(adapter.modules)
    matched = [(n, m) for n, m in model.named_modules() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not matched:
        raise ConfigError(f"the adapter names no module of {type(model).__name__} ({', '.join(patterns)}); "
                          "give glob patterns of names from model.named_modules()")

    def hook_for(name: str):
        def hook(module, args, kwargs, output):
            got = adapter.read(module, args, kwargs, output)
            if got is None:
                return
            if not isinstance(got, AttentionCall):
                q, k, mask, scale = got
                mask, bias = as_visible(mask)
                got = AttentionCall(q, k, scale=scale, mask=mask, bias=bias, name=name, module=module)
            on_call(got if got.name else dataclasses.replace(got, name=name, module=got.module or module))

        return hook

    handles = []
    try:
        for name, module in matched:
            handles.append(module.register_forward_hook(hook_for(name), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def named(modules: Iterable[tuple[str, nn.Module]]) -> dict[int, str]:
    """Module id → name, to name the calls of a capture that sees only modules."""
    return {id(m): n for n, m in modules}
