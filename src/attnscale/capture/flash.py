"""Capture of flash-attn's ``flash_attn_func`` and ``flash_attn_varlen_func`` (the ``flash_attn`` package,
2.x), and the packed-sequence rule they share with transformers' flash path: one document never sees another.

For the probe's duration each function is wrapped where it is held (``intercept.holders``): ``flash_attn``,
``flash_attn.flash_attn_interface``, and the globals and classes of the files that define the model's modules;
each is put back on exit, even on error. Only a process that has imported ``flash_attn`` is touched.

Read as flash-attn documents them (its arguments are bound by name against the function's own signature):
q, k, v are B×T×H×D (varlen: total tokens × H × D, documents cut at ``cu_seqlens_q``/``cu_seqlens_k``);
``softmax_scale`` (None: 1/sqrt(D)); ``causal`` aligned bottom-right (query i sees key j ≤ i + S - T);
``window_size=(left, right)``: keys from i + S - T - left to i + S - T + right (-1: no limit; causal sets
right to 0); ``softcap`` (0: none) on the scaled score; ``alibi_slopes`` (H or B×H), a bias of
-slope·|i + S - T - j| after the cap; fewer key heads than query heads is GQA. In a varlen call S and T are
each document's lengths and a query sees only keys of its own document (``packed``): a mask_mod over the
packed row, so no T×T mask is made and each document's rows are counted once.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attnscale.capture.call import AttentionCall, OnCall
from attnscale.capture.intercept import Namer, original_of, wrapper, wrapping

__all__ = ["capture_flash", "cu_from_positions", "flash_call", "flash_varlen_call", "packed"]

FUNCTIONS = ("flash_attn_func", "flash_attn_varlen_func")
LIBRARIES = ("flash_attn", "flash_attn.flash_attn_interface")

_ACTIVE: contextvars.ContextVar[tuple[OnCall, Namer] | None] = contextvars.ContextVar("attnscale_watch_flash", default=None)


def _limits(window_size, causal: bool) -> tuple[int | None, int | None]:
    """flash-attn's (left, right) as reaches, None where unlimited (a negative side); causal: right is 0."""
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    return (left if left >= 0 else None), (0 if causal else right if right >= 0 else None)


def _slopes(alibi_slopes: torch.Tensor | None, b: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
    if alibi_slopes is None:
        return None
    s = alibi_slopes.float()
    return s[h] if s.ndim == 1 else s[b, h]


def packed(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool = False, window_size=(-1, -1),
           alibi_slopes: torch.Tensor | None = None) -> tuple[Callable, Callable | None]:
    """(mask_mod, bias_mod or None) over a packed row of documents cut at ``cu_seqlens_q``/``cu_seqlens_k``
    (cumulative lengths, starting at 0): query i of document d sees key j of the same document only, within
    flash-attn's causal and window rule aligned bottom-right in that document; ALiBi (per head, or per
    document and head) by the same alignment. Rows past the last document see nothing."""
    cu_q, cu_k = cu_seqlens_q.long().flatten(), cu_seqlens_k.long().flatten()
    left, right = _limits(window_size, causal)
    docs = len(cu_q) - 1

    def where(q_idx, kv_idx):
        cq, ck = cu_q.to(q_idx.device), cu_k.to(q_idx.device)
        dq = (torch.searchsorted(cq, q_idx, right=True) - 1).clamp(0, docs - 1)
        dk = (torch.searchsorted(ck, kv_idx, right=True) - 1).clamp(0, docs - 1)
        # key j of the query's document is at local offset j - ck[d]; bottom-right: j ≤ i + (ck[d+1] - cq[d+1])
        return dq, dk, q_idx + ck[dq + 1] - cq[dq + 1], (q_idx < cq[-1]) & (kv_idx < ck[-1])

    def mask_mod(b, h, q_idx, kv_idx):
        dq, dk, diagonal, inside = where(q_idx, kv_idx)
        seen = inside & (dq == dk)
        if right is not None:
            seen = seen & (kv_idx <= diagonal + right)
        if left is not None:
            seen = seen & (kv_idx >= diagonal - left)
        return seen

    def bias_mod(b, h, q_idx, kv_idx):
        dq, _, diagonal, _ = where(q_idx, kv_idx)
        return -_slopes(alibi_slopes, dq, h) * (diagonal - kv_idx).abs()

    return mask_mod, (None if alibi_slopes is None else bias_mod)


def cu_from_positions(position_ids: torch.Tensor) -> torch.Tensor | None:
    """Documents packed in one row, as transformers' flash path reads them from ``position_ids`` (1×T, or T):
    a document starts wherever the position is the row's least. None where the positions only increase (one
    document; transformers then runs the plain function)."""
    pos = position_ids.reshape(-1)
    if position_ids.ndim > 1 and position_ids.shape[0] != 1 or len(pos) < 2:
        return None
    if not bool(((torch.arange(len(pos), device=pos.device) + pos.min()) != pos).any()):
        return None
    starts = (pos == pos.min()).nonzero().flatten()
    return torch.cat([starts, torch.tensor([len(pos)], device=pos.device)])


def flash_call(q, k, v=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
               alibi_slopes=None, *rest, name: str = "", **kwargs) -> AttentionCall:
    """A ``flash_attn_func`` call's arguments (B×T×H×D), read as flash-attn reads them."""
    T, S = q.shape[1], k.shape[1]
    left, right = _limits(window_size, causal)
    diagonal = S - T

    def mask_mod(b, h, q_idx, kv_idx):  # the right side of a window that is not causal
        return kv_idx <= q_idx + diagonal + right

    def bias_mod(b, h, q_idx, kv_idx):
        return -_slopes(alibi_slopes, b, h) * (q_idx + diagonal - kv_idx).abs()

    return AttentionCall(q.transpose(1, 2), k.transpose(1, 2), scale=softmax_scale, is_causal=bool(causal),
                         diagonal=diagonal, window=None if left is None else left + 1,
                         mask_mod=mask_mod if right is not None and not causal else None,
                         softcap=float(softcap) if softcap else None,
                         bias_mod=None if alibi_slopes is None else bias_mod, name=name)


def flash_varlen_call(q, k, v=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                      dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                      alibi_slopes=None, *rest, name: str = "", **kwargs) -> AttentionCall:
    """A ``flash_attn_varlen_func`` call's arguments (total tokens × H × D), as one packed row of documents."""
    mask_mod, bias_mod = packed(cu_seqlens_q, cu_seqlens_k, causal, window_size, alibi_slopes)
    return AttentionCall(q.transpose(0, 1)[None], k.transpose(0, 1)[None], scale=softmax_scale, mask_mod=mask_mod,
                         softcap=float(softcap) if softcap else None, bias_mod=bias_mod, name=name)


READERS = {"flash_attn_func": flash_call, "flash_attn_varlen_func": flash_varlen_call}


def _named(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by their names in ``signature``, defaults filled in (a ``**kwargs``'s spread out)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    out = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


def _reader(read: Callable, original: Callable) -> Callable:
    signature = inspect.signature(original)
    return lambda args, kwargs, namer: read(**_named(signature, args, kwargs), name=namer())


@contextlib.contextmanager
def capture_flash(model: nn.Module | None, on_call: OnCall, where: list[str] | None = None) -> Iterator[None]:
    """Every flash-attn call made inside, handed to ``on_call`` before it runs (see the module's docstring;
    ``where``: the names a capture around this one keeps)."""
    libraries = [sys.modules[n] for n in LIBRARIES if n in sys.modules]
    targets = []
    for function, read in READERS.items():
        held = {id(f): f for f in (original_of(getattr(m, function, None)) for m in libraries) if callable(f)}
        if held:
            targets.append((tuple(held.values()), [(m, function) for m in libraries],
                            lambda f, read=read: wrapper(f, _ACTIVE, _reader(read, f))))
    with wrapping(model, targets, _ACTIVE, on_call, "flash_attn", where):
        yield
