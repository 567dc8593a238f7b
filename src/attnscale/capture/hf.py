"""Capture from Hugging Face models, through transformers' ``AttentionInterface``.

Since transformers 4.48 every attention module of the supported models hands
its q (after RoPE and any q-norm), its k (before GQA's ``repeat_kv``), v, the
mask, its own ``scaling`` and any ``softcap`` or ``sliding_window`` to one
function, looked up at each call by the name in ``config._attn_implementation``:
``ALL_ATTENTION_FUNCTIONS[name]``, or the modeling file's own
``eager_attention_forward`` for "eager".

For the duration of a probe that very function is wrapped, under its own name:
the wrapper hands the call to the capture, then calls the model's function with
the same arguments, so the model keeps its path (sdpa, eager, flash, ...), its
masks (built for that name, as before) and its outputs. The config is never
touched. On exit, even on error, every wrapped entry is put back as it was
(by the last probe out, where probes in several threads share a wrapper). The
wrapper only reads the calls of the model being probed, in the context that
probes it; any other model calling the same function meanwhile passes straight
through.

The mask is read in the format the implementation gets: sdpa's boolean mask
(None when ``is_causal`` alone says it: then causal), eager's additive float
mask (None: no mask), flash's 2-D padding mask with the module's ``is_causal``
and ``sliding_window`` (flash is read as transformers documents it; it is not
installed where the tests run), flex_attention's BlockMask through its
``mask_mod``. A ``position_bias`` is added to the scores. Not read: learned
attention sinks (``s_aux``), which take weight from every row.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from attnscale.errors import ConfigError
from attnscale.capture.call import AttentionCall, OnCall, named
from attnscale.capture.sdpa import paused

__all__ = ["capture_hf", "hf_call", "implementations"]

# (on_call, {id(module): name}) of the capture in progress in this context, or None.
_ACTIVE: contextvars.ContextVar[tuple[OnCall, dict[int, str]] | None] = contextvars.ContextVar(
    "attnscale_watch_hf", default=None)
_WRAPPED = "__attnscale_watch_wraps__"


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a probe never needs the Hub
    try:
        import transformers
    except ImportError:
        raise ConfigError("capturing a Hugging Face model needs transformers; install the extra from the clone: pip install -e '.[hf]'") from None
    return transformers


def _configs(model: nn.Module) -> list[Any]:
    """Every config the model's modules read, sub-configs included (once each)."""
    found: dict[int, Any] = {}
    todo = [getattr(m, "config", None) for m in model.modules()]
    while todo:
        c = todo.pop()
        if c is None or id(c) in found or not hasattr(c, "_attn_implementation"):
            continue
        found[id(c)] = c
        todo.extend(getattr(c, k, None) for k in getattr(c, "sub_configs", {}) or {})
    return list(found.values())


def implementations(model: nn.Module) -> set[str]:
    """The attention implementations the model's configs name ("eager" for None, as transformers reads it)."""
    return {c._attn_implementation or "eager" for c in _configs(model)}


def hf_call(module: nn.Module, impl: str, query: torch.Tensor, key: torch.Tensor, attention_mask, kwargs: dict,
            name: str = "") -> AttentionCall:
    """One call to an ``AttentionInterface`` function, read as implementation ``impl`` reads it."""
    T, S = query.shape[-2], key.shape[-2]
    scaling, softcap = kwargs.get("scaling"), kwargs.get("softcap")
    is_causal = kwargs.get("is_causal")
    is_causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    bias = kwargs.get("position_bias")
    read = dict(scale=scaling, softcap=softcap, bias=bias.float() if isinstance(bias, torch.Tensor) else None, name=name,
                module=module)
    if "flash" in impl:  # a 2-D padding mask of the keys (B×S), causal aligned bottom-right, a sliding window
        mask = attention_mask
        if isinstance(mask, torch.Tensor) and mask.ndim == 2:
            mask = mask.bool()[:, None, None, :]
        return AttentionCall(query, key, mask=mask, is_causal=is_causal and T > 1, diagonal=S - T,
                             window=kwargs.get("sliding_window"), **read)
    if isinstance(attention_mask, torch.Tensor):
        return AttentionCall(query, key, mask=attention_mask, **read)
    if attention_mask is not None and hasattr(attention_mask, "mask_mod"):  # flex_attention's BlockMask
        return AttentionCall(query, key, mask_mod=attention_mask.mask_mod, **read)
    # sdpa and its kin: no mask means is_causal alone says it; eager: no mask, every key
    return AttentionCall(query, key, is_causal=impl != "eager" and is_causal and T > 1, **read)


def _wrap(original, impl: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        active = _ACTIVE.get()
        if active is not None and id(module) in active[1]:
            on_call, names = active
            on_call(hf_call(module, impl, query.detach(), key.detach(), attention_mask, kwargs, names[id(module)]))
        with paused():  # an SDPA interception in the same probe does not read this call twice
            return original(module, query, key, value, attention_mask, *args, **kwargs)

    setattr(attention, _WRAPPED, original)
    attention.__name__ = getattr(original, "__name__", "attention")
    attention.__doc__ = getattr(original, "__doc__", None)
    return attention


def _interfaces(model: nn.Module, transformers) -> list[Any]:
    """The AttentionInterface instances the model's modeling files call (most share the global one)."""
    found = {id(transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS): transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS}
    for module in _modeling_files(model):
        interface = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
        if isinstance(interface, transformers.AttentionInterface):
            found.setdefault(id(interface), interface)
    return list(found.values())


def _modeling_files(model: nn.Module) -> list[Any]:
    names = {type(m).__module__ for m in model.modules()}
    return [sys.modules[n] for n in sorted(names) if n in sys.modules]


# The wrappers in place: (where, name) -> [probes using it, how to put the original back]. Probes
# in several threads (or nested) share one wrapper; the last one out puts the original back.
_INSTALLED: dict[tuple[int, str], list] = {}
_LOCK = threading.Lock()


def _install(where: Any, name: str, impl: str, get, put, drop) -> tuple[int, str] | None:
    """Wrap the function of implementation ``impl`` that ``get()`` reads at ``name`` in ``where``
    (``put`` sets a function there, ``drop`` puts the original back), or join the wrapper there."""
    key = (id(where), name)
    with _LOCK:
        if key in _INSTALLED:
            _INSTALLED[key][0] += 1
            return key
        original = get()
        if not callable(original) or hasattr(original, _WRAPPED):
            return None
        put(_wrap(original, impl))
        _INSTALLED[key] = [1, lambda: drop(original)]
        return key


def _release(key: tuple[int, str]) -> None:
    with _LOCK:
        entry = _INSTALLED[key]
        entry[0] -= 1
        if entry[0] == 0:
            del _INSTALLED[key]
            entry[1]()


@contextlib.contextmanager
def capture_hf(model: nn.Module, on_call: OnCall) -> Iterator[None]:
    """Every AttentionInterface call of ``model`` made inside, handed to ``on_call``
    before the model's own function runs (see the module's docstring)."""
    transformers = _transformers()
    keys = []
    try:
        for impl in sorted(implementations(model)):
            if impl == "eager":  # not in the interface: each modeling file's own function
                for module in _modeling_files(model):
                    if callable(getattr(module, "eager_attention_forward", None)):
                        keys.append(_install(
                            module, "eager_attention_forward", impl, lambda m=module: m.eager_attention_forward,
                            lambda f, m=module: setattr(m, "eager_attention_forward", f),
                            lambda f, m=module: setattr(m, "eager_attention_forward", f)))
                continue
            for interface in _interfaces(model, transformers):
                if impl in interface:  # the instance's own entry, over the class-wide one
                    keys.append(_install(
                        interface, impl, impl, lambda i=interface, n=impl: i[n],
                        lambda f, i=interface, n=impl: i.__setitem__(n, f),
                        lambda f, i=interface, n=impl: _put_back(i, n, f)))
        token = _ACTIVE.set((on_call, named(model.named_modules())))
        try:
            yield
        finally:
            _ACTIVE.reset(token)
    finally:
        for key in reversed(keys):
            if key is not None:
                _release(key)


def _put_back(interface, impl: str, original) -> None:
    """Drop our entry; if the name then reads something else than it did, give it back its own."""
    del interface[impl]
    if impl not in interface or interface[impl] is not original:
        interface[impl] = original
