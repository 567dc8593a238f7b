"""Capture by interception: every call to ``torch.nn.functional.scaled_dot_product_attention``
(nanoGPT, torchtitan, timm and most hand-written models make one per layer).

For the duration of the probe a ``torch.overrides.TorchFunctionMode`` is pushed:
it sees each SDPA call with its arguments exactly as the model passed them
(q, k, ``attn_mask`` boolean or additive float, ``is_causal``, ``scale``,
``enable_gqa``), hands them over as an ``AttentionCall`` and then makes the
call itself unchanged. The model's code is not touched; the mode is popped on
exit, even on error, and it is local to the thread that pushed it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attnscale.core.hooks import HookPoint
from attnscale.capture.call import AttentionCall, OnCall

__all__ = ["capture_sdpa", "paused", "sdpa_call"]

# True while a capture above this one (transformers' AttentionInterface) already reads the call.
_PAUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("attnscale_watch_sdpa_paused", default=False)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """SDPA calls made inside are not captured (a capture that reads the same call
    one level up, with more to say, uses this)."""
    token = _PAUSED.set(True)
    try:
        yield
    finally:
        _PAUSED.reset(token)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """(..., H, L, E) as (B, H, L, E): no batch dim gets one, several are flattened into one."""
    if x.ndim == 3:
        return x[None]
    return x.reshape(-1, *x.shape[-3:]) if x.ndim > 4 else x


def sdpa_call(query, key, value=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              name: str = "") -> AttentionCall:
    """An SDPA call's arguments, read as SDPA reads them, as an ``AttentionCall``."""
    q, k = _heads_first(query), _heads_first(key)
    mask = attn_mask
    if mask is not None and query.ndim != 4:  # the mask broadcasts against the call's own shape
        mask = _heads_first(mask.expand(*query.shape[:-1], key.shape[-2]))
    if not enable_gqa and k.shape[1] != q.shape[1]:  # SDPA broadcasts a single key head
        k = k.expand(k.shape[0], q.shape[1], *k.shape[2:])
    return AttentionCall(q, k, scale=scale, mask=mask, is_causal=bool(is_causal), name=name)


class _Intercept(TorchFunctionMode):
    def __init__(self, on_call: OnCall, where: list[str]):
        super().__init__()
        self.on_call, self.where, self.calls = on_call, where, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not _PAUSED.get():
            # the mode is off while this runs: the measuring below is not intercepted
            # only calls made outside every module are numbered: under torch.compile a counter read on every
            # call would be a guard that fails on the next step, and the graph would recompile each time
            if self.where:
                name = self.where[-1]
            else:
                name, self.calls = f"sdpa call {self.calls}", self.calls + 1
            self.on_call(sdpa_call(*args, **kwargs, name=name))
        return func(*args, **kwargs)


@contextlib.contextmanager
def capture_sdpa(model: nn.Module | None, on_call: OnCall) -> Iterator[None]:
    """Every ``scaled_dot_product_attention`` call made inside, in the order they
    come, handed to ``on_call`` before it runs. With a ``model``, each call is
    named after the innermost of its modules running at the time (pre- and
    post-forward hooks keep track, removed on exit); without, by its number."""
    where: list[str] = []

    def enter(name: str):
        def hook(module, args) -> None:
            where.append(name)

        return hook

    def leave(module, args, output) -> None:  # returns None: the output stays the module's
        if where:
            where.pop()

    handles = []
    try:
        for name, module in (model.named_modules() if model is not None else []):
            if name and not isinstance(module, HookPoint):  # a hooked HookPoint would switch attnscale off SDPA
                handles.append(module.register_forward_pre_hook(enter(name)))
                handles.append(module.register_forward_hook(leave, always_call=True))
        with _Intercept(on_call, where):
            yield
    finally:
        for h in handles:
            h.remove()
