"""Capture of direct ``torch.nn.attention.flex_attention.flex_attention`` calls (torchtitan, the nanoGPT
speedruns): the model's own ``score_mod`` and ``block_mask``, read as flex reads them.

flex_attention is a higher-order op called from a Python function, so no TorchFunctionMode sees it. For the
probe's duration the function is wrapped wherever it is held (``intercept.holders``): in
``torch.nn.attention.flex_attention`` itself, in the globals of each file that defines one of the model's
modules (``from torch.nn.attention.flex_attention import flex_attention``), and on those modules' classes
(torchtitan keeps ``torch.compile(flex_attention)`` as a class attribute), a compiled copy wrapped as it is.
The wrapper hands the call over and makes it unchanged; every one is put back on exit, even on error. The
library is imported on entry where it is not yet (a model may import flex_attention inside its forward, and
would otherwise take the original on a first probe); the import compiles nothing.

The call, as an ``AttentionCall`` (``flex_call``): q·k × scale (None: 1/sqrt(D)); the score_mod as given,
for the weights (the score measures read the score before it: ``call.py``); the block mask as the compiled
kernels read it, a key visible where its block is a full block, or a partial block whose ``mask_mod`` holds
(``block_mask_mod``; a mask made by ``create_block_mask`` reads the same as its mask_mod; flex's unfused eager
path reads the mask_mod alone); GQA with ``enable_gqa``; a key batch of 1 serves every query.

The kernel's own max (``KernelMax``): a reader with a ``kernel_max(call, max_BHT)`` method (QK-Clip's) is not
handed the call before it runs; flex is asked for its per-row largest score as well
(``return_aux=AuxRequest(max_scores=True)``, added to whatever the model asked for, which it gets back as it
asked), and the reader gets the call with that B×H×T tensor after. flex refuses the request on the CPU and MPS
(``MAX_SCORES_REFUSED``; a NotImplementedError elsewhere is taken the same way): the call is then handed over
before it runs, as to any reader.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from attnscale.capture.call import AttentionCall, OnCall
from attnscale.capture.intercept import Namer, is_paused, original_of, paused, wrapper, wrapping

__all__ = ["MAX_SCORES_REFUSED", "KernelMax", "block_mask_mod", "capture_flex", "flex_call"]

# The device types on which flex_attention refuses to return max_scores (torch 2.13: NotImplementedError).
MAX_SCORES_REFUSED = ("cpu", "mps")

FLEX_MODULE = "torch.nn.attention.flex_attention"

# (on_call, namer) of the capture in progress in this context, or None.
_ACTIVE: contextvars.ContextVar[tuple[OnCall, Namer] | None] = contextvars.ContextVar("attnscale_watch_flex", default=None)


def _dense(num: torch.Tensor, indices: torch.Tensor, cols: int) -> torch.Tensor:
    """A BlockMask's (…, rows) block counts and (…, rows, n) block indices as (…, rows, cols) booleans."""
    taken = torch.arange(indices.shape[-1], device=indices.device) < num[..., None]
    out = torch.zeros(*indices.shape[:-1], cols + 1, dtype=torch.bool, device=indices.device)
    out.scatter_(-1, torch.where(taken, indices.long(), cols), True)
    return out[..., :cols]


def block_mask_mod(block_mask: Any) -> Callable:
    """A BlockMask as one mask_mod (b, h, q_idx, kv_idx) -> bool: the blocks it computes, its ``mask_mod``
    within its partial blocks (never within its full ones), every other block hidden."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    cols = max(block_mask.kv_indices.shape[-1], -(-block_mask.seq_lengths[1] // kv_block))
    partial = _dense(block_mask.kv_num_blocks, block_mask.kv_indices, cols)
    full = None
    if block_mask.full_kv_num_blocks is not None:
        full = _dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, cols)
    inner = block_mask.mask_mod

    def mask_mod(b, h, q_idx, kv_idx):
        part = partial.to(q_idx.device)
        bb = b if part.shape[0] > 1 else torch.zeros_like(b)
        hh = h if part.shape[1] > 1 else torch.zeros_like(h)
        qb, kb = q_idx // q_block, kv_idx // kv_block
        seen = part[bb, hh, qb, kb] & torch.as_tensor(inner(b, h, q_idx, kv_idx), device=q_idx.device).bool()
        return seen if full is None else seen | full.to(q_idx.device)[bb, hh, qb, kb]

    return mask_mod


def flex_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None, score_mod: Callable | None = None,
              block_mask: Any = None, scale: float | None = None, enable_gqa: bool = False, *rest, name: str = "",
              **kwargs) -> AttentionCall:
    """A flex_attention call's arguments, read as flex reads them, as an ``AttentionCall``."""
    if getattr(score_mod, "__name__", "") == "_identity" and getattr(score_mod, "__module__", "") == FLEX_MODULE:
        score_mod = None
    k = key.expand(query.shape[0], *key.shape[1:]) if key.shape[0] == 1 else key
    mask_mod = None if block_mask is None else block_mask_mod(block_mask)
    return AttentionCall(query, k, scale=scale, mask_mod=mask_mod, score_mod=score_mod, name=name)


def _readable(query, key, value=None, score_mod=None, block_mask=None, scale=None, enable_gqa=False, *rest, **kw) -> bool:
    """A call flex itself would run: query heads one per key head, or whole groups of them under enable_gqa."""
    H, K = query.shape[-3], key.shape[-3]
    return query.ndim == key.ndim == 4 and (H == K or (bool(enable_gqa) and H % K == 0))


def _read(args: tuple, kwargs: dict, namer) -> AttentionCall | None:
    return flex_call(*args, **kwargs, name=namer()) if _readable(*args, **kwargs) else None


class KernelMax(Protocol):
    """A reader that takes the kernel's own per-row largest score where the kernel gives one."""

    def __call__(self, call: AttentionCall) -> None: ...

    def kernel_max(self, call: AttentionCall, max_BHT: torch.Tensor) -> None: ...


def _kernel_wrapper(original: Callable) -> Callable:
    """``wrapper``'s stand-in for flex_attention, asking the kernel for max_scores where the reader takes them."""
    plain = wrapper(original, _ACTIVE, _read)
    refused: set[str] = set()  # device types where the request was refused once: not asked again

    @functools.wraps(original, updated=())
    def attention(*args, **kwargs):
        got = _ACTIVE.get()
        take = getattr(got[0], "kernel_max", None) if got is not None and not is_paused() else None
        query = args[0] if args else kwargs.get("query")
        if (take is None or len(args) > 7 or not torch.is_tensor(query)  # return_lse given by position: not asked
                or query.device.type in MAX_SCORES_REFUSED or query.device.type in refused
                or not hasattr(_library(), "AuxRequest")):
            return plain(*args, **kwargs)
        call = _read(args, kwargs, got[1])
        if call is None or call.score_mod is not None:  # the reader says what it makes of a score_mod
            if call is not None:
                got[0](call)
            with paused():
                return original(*args, **kwargs)
        library = _library()
        asked, lse = kwargs.get("return_aux"), bool(kwargs.get("return_lse", False))
        want_lse = lse or bool(asked is not None and asked.lse)
        request = {k: v for k, v in kwargs.items() if k not in ("return_aux", "return_lse")}
        try:
            with paused():
                out, aux = original(*args, **request, return_aux=library.AuxRequest(lse=want_lse, max_scores=True))
        except NotImplementedError:
            refused.add(query.device.type)
            got[0](call)
            with paused():
                return original(*args, **kwargs)
        take(call, aux.max_scores)
        if asked is not None:
            return out, library.AuxOutput(lse=aux.lse if asked.lse else None,
                                          max_scores=aux.max_scores if asked.max_scores else None)
        return (out, aux.lse) if lse else out

    return attention


def _library() -> Any:
    """torch's flex_attention module, imported if it is not yet; None where this torch has none."""
    library = sys.modules.get(FLEX_MODULE)
    if library is None:
        try:
            library = importlib.import_module(FLEX_MODULE)
        except ImportError:
            return None
    return library


@contextlib.contextmanager
def capture_flex(model: nn.Module | None, on_call: OnCall, where: list[str] | None = None) -> Iterator[None]:
    """Every flex_attention call made inside, in the order they come, handed to ``on_call`` before it runs
    (see the module's docstring); each named after the innermost of ``model``'s modules running, or by its
    number (``where``: the names a capture around this one keeps)."""
    library = _library()
    targets = [] if library is None else [
        ((original_of(library.flex_attention),), [(library, "flex_attention")], _kernel_wrapper)]
    with wrapping(model, targets, _ACTIVE, on_call, "flex_attention", where):
        yield
