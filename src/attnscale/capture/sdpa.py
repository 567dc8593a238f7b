"""Capture by interception: every call to ``torch.nn.functional.scaled_dot_product_attention``
(nanoGPT, torchtitan, timm and most hand-written models make one per layer), and every call to
``F.multi_head_attention_forward`` (``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers: ``mha.py``).

For the duration of the probe a ``torch.overrides.TorchFunctionMode`` is pushed:
it sees each SDPA call with its arguments exactly as the model passed them
(q, k, ``attn_mask`` boolean or additive float, ``is_causal``, ``scale``,
``enable_gqa``), hands them over as an ``AttentionCall`` and then makes the
call itself unchanged. The model's code is not touched; the mode is popped on
exit, even on error, and it is local to the thread that pushed it. A
``multi_head_attention_forward`` call is read from its own arguments (its
projections and masks): the SDPA call it makes inside runs with the mode off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attnscale.capture.call import AttentionCall, OnCall
from attnscale.capture.intercept import Namer, is_paused, paused, running_modules
from attnscale.capture.mha import mha_call

__all__ = ["capture_sdpa", "paused", "sdpa_call"]


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
    def __init__(self, on_call: OnCall, where: list[str], model: nn.Module | None):
        super().__init__()
        self.on_call, self.where, self.model = on_call, where, model
        self.name, self.mha_name = Namer(where, "sdpa"), Namer(where, "multi_head_attention")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # the mode is off while this runs: the measuring below is not intercepted, nor is the SDPA call that
        # multi_head_attention_forward makes inside
        if func is F.scaled_dot_product_attention and not is_paused():
            self.on_call(sdpa_call(*args, **kwargs, name=self.name()))
        elif func is F.multi_head_attention_forward and not is_paused():
            module = self.model.get_submodule(self.where[-1]) if self.where and self.model is not None else None
            self.on_call(mha_call(*args, **kwargs, name=self.mha_name(), module=module))
        return func(*args, **kwargs)


@contextlib.contextmanager
def capture_sdpa(model: nn.Module | None, on_call: OnCall, where: list[str] | None = None) -> Iterator[None]:
    """Every ``scaled_dot_product_attention`` and ``multi_head_attention_forward``
    call made inside, in the order they come, handed to ``on_call`` before it runs.
    With a ``model``, each call is
    named after the innermost of its modules running at the time (pre- and
    post-forward hooks keep track, removed on exit, or ``where`` where a capture
    around this one keeps them); without, by its number."""
    with running_modules(model, where) as where, _Intercept(on_call, where, model):
        yield
