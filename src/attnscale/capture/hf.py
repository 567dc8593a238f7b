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
installed where the tests run), flex_attention's BlockMask as its kernels read
it (``flex.block_mask_mod``). A ``position_bias`` is added to the scores; a
learned attention sink (``s_aux``, gpt-oss) is read as the call's ``sink``.

Packed sequences (several documents in one row, as ``DataCollatorWithFlattening``
makes them): transformers builds the block-diagonal mask itself for sdpa, eager
and flex from ``position_ids`` that restart, and the mask is read as above. The
flash implementations get no mask: they run flash-attn's varlen function over
the flattened tokens, cut at ``cu_seq_lens_q``/``cu_seq_lens_k`` where the
caller gave them (with ``max_length_q``/``max_length_k``), else where
``position_ids`` restart in a batch of one row; the call is read the same way
(``flash.packed``: a document never sees another, and each one's rows count
once).

Where ``position_ids`` restart inside a row but the mask the model built lets one document see another
(transformers builds none with a cache in use), the probe warns once (``packed.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from attnscale.errors import ConfigError
from attnscale.capture.call import AttentionCall, OnCall, named
from attnscale.capture.flash import cu_from_positions, packed
from attnscale.capture.flex import block_mask_mod
from attnscale.capture.intercept import install, installed, paused
from attnscale.capture.packed import PackedDocumentsWarning, Packing, message

__all__ = ["capture_hf", "hf_call", "implementations"]

# (on_call, {id(module): name}, what the calls say of packed documents) of the capture in progress in this
# context, or None.
_ACTIVE: contextvars.ContextVar[tuple[OnCall, dict[int, str], Packing | None] | None] = contextvars.ContextVar(
    "attnscale_watch_hf", default=None)


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
    bias, sink = kwargs.get("position_bias"), kwargs.get("s_aux")
    read = dict(scale=scaling, softcap=softcap, bias=bias.float() if isinstance(bias, torch.Tensor) else None, name=name,
                module=module, sink=sink.detach().float() if isinstance(sink, torch.Tensor) else None)
    if "flash" in impl:
        window = kwargs.get("sliding_window")
        cu = _documents(query.shape[0], attention_mask, kwargs)
        if cu is not None:  # varlen over the flattened tokens, causal bottom-right within each document
            reach = -1 if window is None else window - 1  # transformers' window of w: (w - 1, w - 1) to flash-attn
            mask_mod, _ = packed(*cu, causal=is_causal, window_size=(reach, reach))
            flat = [x.transpose(0, 1).reshape(x.shape[1], -1, x.shape[-1])[None] for x in (query, key)]
            return AttentionCall(*flat, mask_mod=mask_mod, **read)
        mask = attention_mask  # a 2-D padding mask of the keys (B×S), causal aligned bottom-right, a sliding window
        if isinstance(mask, torch.Tensor) and mask.ndim == 2:
            mask = mask.bool()[:, None, None, :]
        return AttentionCall(query, key, mask=mask, is_causal=is_causal and T > 1, diagonal=S - T, window=window,
                             **read)
    if isinstance(attention_mask, torch.Tensor):
        return AttentionCall(query, key, mask=attention_mask, **read)
    if attention_mask is not None and hasattr(attention_mask, "mask_mod"):  # flex_attention's BlockMask
        return AttentionCall(query, key, mask_mod=block_mask_mod(attention_mask), **read)
    # sdpa and its kin: no mask means is_causal alone says it; eager: no mask, every key
    return AttentionCall(query, key, is_causal=impl != "eager" and is_causal and T > 1, **read)


def _documents(batch: int, attention_mask, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where transformers' flash path cuts the flattened tokens into documents: (cu_seq_lens_q, cu_seq_lens_k),
    or None where it runs the plain function (or unpads a 2-D mask, which is read as a mask)."""
    if attention_mask is not None:
        return None
    given = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
    if all(x is not None for x in given):
        return given[0], given[1]
    position_ids = kwargs.get("position_ids")
    cu = cu_from_positions(position_ids) if isinstance(position_ids, torch.Tensor) and batch == 1 else None
    return None if cu is None else (cu, cu)


def _wrap(original, impl: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        active = _ACTIVE.get()
        if active is not None and id(module) in active[1]:
            on_call, names, packing = active
            call = hf_call(module, impl, query.detach(), key.detach(), attention_mask, kwargs, names[id(module)])
            if packing is not None:
                packing.check(call, kwargs.get("position_ids"))
            on_call(call)
        with paused():  # an SDPA interception in the same probe does not read this call twice
            return original(module, query, key, value, attention_mask, *args, **kwargs)

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


@contextlib.contextmanager
def capture_hf(model: nn.Module, on_call: OnCall, packing: bool = True) -> Iterator[None]:
    """Every AttentionInterface call of ``model`` made inside, handed to ``on_call``
    before the model's own function runs (see the module's docstring). ``packing``: warn, as the context
    ends, where packed documents see each other (``packed.Packing``; a reader of the scores as the model makes
    them, QK-Clip's, has no use for it and skips its look at every forward's position ids)."""
    transformers = _transformers()
    keys: list = []
    with installed(keys):
        for impl in sorted(implementations(model)):
            wrap = functools.partial(_wrap, impl=impl)
            if impl == "eager":  # not in the interface: each modeling file's own function
                for module in _modeling_files(model):
                    if callable(getattr(module, "eager_attention_forward", None)):
                        keys.append(install(
                            module, "eager_attention_forward", wrap, lambda m=module: m.eager_attention_forward,
                            lambda f, m=module: setattr(m, "eager_attention_forward", f),
                            lambda f, m=module: setattr(m, "eager_attention_forward", f)))
                continue
            for interface in _interfaces(model, transformers):
                if impl in interface:  # the instance's own entry, over the class-wide one
                    keys.append(install(
                        interface, impl, wrap, lambda i=interface, n=impl: i[n],
                        lambda f, i=interface, n=impl: i.__setitem__(n, f),
                        lambda f, i=interface, n=impl: _put_back(i, n, f)))
        packed = Packing() if packing else None
        token = _ACTIVE.set((on_call, named(model.named_modules()), packed))
        try:
            yield
        finally:
            _ACTIVE.reset(token)
        if packed is not None and packed.crossed is not None:  # one warning a forward, its text the same each
            # step: the filter shows it once
            warnings.warn(message(type(model).__name__, packed.crossed), PackedDocumentsWarning, stacklevel=1)


def _put_back(interface, impl: str, original) -> None:
    """Drop our entry; if the name then reads something else than it did, give it back its own."""
    del interface[impl]
    if impl not in interface or interface[impl] is not original:
        interface[impl] = original
