"""One attention call as the model made it, and the rule that tells a hidden key from a bias.

Every capture hands over an ``AttentionCall``; the reduction (``reduce.py``)
reads its mask and bias a block of query rows at a time, so no call ever needs
a T×S mask in memory.

The visible-key rule, written once (``HIDDEN_AT``): a key is hidden from a query
where a boolean mask holds False, where a causal or sliding-window structure
excludes it, or where an additive mask holds -inf or any value at or below
-10,000 (the fills in use: -1e4 in older BERTs, -1e9 in hand-written models,
``finfo.min`` in transformers). No softmax gives such a key any weight beside a
visible one (e^-10,000 underflows even float64), so reading it as hidden loses
nothing of the weights, and keeps the fill out of every score measure. Additive
values above the line are a bias: they enter the weights, never the scores. A NaN
hides nothing: the model's softmax makes its row NaN, and the row reads NaN here too.

A flex_attention ``score_mod`` mixes the two (ALiBi, a soft-cap, a mask written
as -inf): its output is what the weights read, and the score measures read the
score before it. Where it takes a key's logit to -inf, or 10,000 or more below
the score, that key is hidden, by the same line. An attention ``sink`` (a learned
logit per head in the softmax's denominator, as gpt-oss has) is no key and no
score: it takes weight from every row and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscale.errors import ConfigError

__all__ = ["HIDDEN_AT", "AttentionCall", "OnCall", "hidden_keys", "named"]

HIDDEN_AT = -1e4


def _rows(x: torch.Tensor | None, rows, T: int, keys: slice = slice(None), S: int = 0, seqs: slice = slice(None),
          heads: slice = slice(None)) -> torch.Tensor | None:
    """``x`` (broadcastable to B×H×T×S, fewer dims padded in front) cut to query rows ``rows``, keys ``keys``,
    sequences ``seqs`` and query heads ``heads`` (a dim of 1 broadcasts and stays)."""
    if x is None:
        return None
    while x.ndim < 4:
        x = x[None]
    x = x[:, :, rows] if x.shape[2] == T and T > 1 else x
    x = x[..., keys] if x.shape[3] == S and S > 1 else x
    return x[seqs if x.shape[0] > 1 else slice(None), heads if x.shape[1] > 1 else slice(None)]


@dataclass(frozen=True, eq=False)  # tensors inside: compared by identity
class AttentionCall:
    """One attention call, as the model made it.

    ``q``: B×H×T×D, after anything done to it before the product (RoPE, q-norm);
    ``k``: B×K×S×D with K key/value heads (GQA: K divides H, and query head h
    reads key head h // (H / K), as ``repeat_kv`` and SDPA's ``enable_gqa`` do).
    ``scale``: the factor on q·kᵀ (None: 1/sqrt(D), SDPA's default).
    ``mask``: broadcastable to B×H×T×S, boolean (True where a query may see a
    key) or additive float (read by ``HIDDEN_AT``'s rule); None: every key.
    ``is_causal``: key j is seen from query i only where j <= i + ``diagonal``
    (0: aligned top-left, as SDPA; S - T: bottom-right, as flash-attn), and
    within ``window`` keys of it where a window is given. ``mask_mod``: a
    function (b, h, q_idx, kv_idx) -> bool as flex_attention takes it, read a
    block at a time. ``softcap``: c·tanh(s/c) after the scale; ``cap``: any
    other squash (it wins over ``softcap``). ``bias``: added to the scores after
    the cap (a position bias); ``bias_mod``: the same as a function
    (b, h, q_idx, kv_idx) -> float, read a block at a time (flash-attn's ALiBi,
    never a T×S tensor). ``score_mod``: a function (score, b, h, q_idx, kv_idx)
    -> logit as flex_attention takes it, applied to the score (after the cap),
    before the bias: it enters the weights, never the score measures.
    ``sink``: a logit per query head (H,) added to every row's softmax
    denominator as one more entry that is no key (``HeadSums`` says what the
    row measures make of it). ``name``: where the call came from, for the
    reader; ``module``: the module that made it, where the capture knows it."""

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
    diagonal: int = 0
    window: int | None = None
    mask_mod: Callable | None = None
    score_mod: Callable | None = None
    sink: torch.Tensor | None = None
    bias_mod: Callable | None = None

    def __post_init__(self):
        # a call of no head measures nothing: said here, not as a division by zero deep in the reduction
        if self.q.ndim == 4 and self.k.ndim == 4 and not (self.q.shape[1] and self.k.shape[1]):
            raise ConfigError(f"the attention call {self.name or '(unnamed)'} has {self.q.shape[1]} query and "
                              f"{self.k.shape[1]} key heads (q {tuple(self.q.shape)}, k {tuple(self.k.shape)}): a call "
                              "is measured with one head or more of each; give q as B×H×T×D and k as B×K×S×D")

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

    def indices(self, rows=slice(None), device=None, keys: slice = slice(None), seqs: slice = slice(None),
                heads: slice = slice(None)) -> tuple[torch.Tensor, ...]:
        """(b, h, q_idx, kv_idx) of sequences ``seqs``, query heads ``heads``, rows ``rows`` (a slice or index
        tensor) and ``keys``, shaped to broadcast to B×H×R×K: what a mask_mod, bias_mod or score_mod reads."""
        device = self.q.device if device is None else device
        B, H, T, S = self.q.shape[0], self.q.shape[1], self.q.shape[-2], self.k.shape[-2]
        b = torch.arange(B, device=device)[seqs][:, None, None, None]
        h = torch.arange(H, device=device)[heads][None, :, None, None]
        r = torch.arange(T, device=device)[rows][None, None, :, None]
        return b, h, r, torch.arange(S, device=device)[keys][None, None, None, :]

    def visible(self, rows=slice(None), device=None, keys: slice = slice(None), seqs: slice = slice(None),
                heads: slice = slice(None)) -> torch.Tensor | None:
        """Which of ``keys`` the query rows ``rows`` (a slice or index tensor) of sequences ``seqs`` and query
        heads ``heads`` see: boolean, broadcastable to B×H×R×K over those (None: every key)."""
        T, S = self.q.shape[-2], self.k.shape[-2]
        device = self.q.device if device is None else device
        b, h, q_idx, kv_idx = self.indices(rows, device, keys, seqs, heads)
        r, j = q_idx[0, 0, :, 0], kv_idx[0, 0, 0]
        out = None
        if self.mask is not None:
            out = _rows(self.mask, rows, T, keys, S, seqs, heads).to(device)
            out = out if out.dtype == torch.bool else ~(out <= HIDDEN_AT)  # NaN: no hidden key, a bias of NaN
        if self.is_causal or self.window is not None:
            i = r[:, None] + self.diagonal
            structure = j[None, :] <= i if self.is_causal else torch.ones(len(r), len(j), dtype=torch.bool, device=device)
            if self.window is not None:
                structure = structure & (i - j[None, :] < self.window)
            out = structure[None, None] if out is None else out & structure
        if self.mask_mod is not None:
            seen = self.mask_mod(b, h, q_idx, kv_idx).bool()
            out = seen if out is None else out & seen
        return out

    def key_range(self, first_row: int, last_row: int) -> slice:
        """The keys any of the query rows ``first_row`` … ``last_row`` can see at all: under a causal mask none
        past the last row's diagonal, under a window none before the first row's window."""
        S = self.k.shape[-2]
        stop = min(S, last_row + self.diagonal + 1) if self.is_causal else S
        start = max(0, first_row + self.diagonal - self.window + 1) if self.window is not None else 0
        return slice(min(start, stop), stop)

    def bias_rows(self, rows=slice(None), device=None, keys: slice = slice(None), seqs: slice = slice(None),
                  heads: slice = slice(None)) -> torch.Tensor | None:
        """What is added to the scores of query rows ``rows`` at ``keys`` over their visible keys, float32,
        broadcastable to B×H×R×K (of ``seqs`` and ``heads``): ``bias``, ``bias_mod``'s, and the part of an
        additive mask above ``HIDDEN_AT`` (None: nothing)."""
        T, S = self.q.shape[-2], self.k.shape[-2]
        device = self.q.device if device is None else device
        out = None if self.bias is None else _rows(self.bias, rows, T, keys, S, seqs, heads).to(device).float()
        if self.bias_mod is not None:
            part = torch.as_tensor(self.bias_mod(*self.indices(rows, device, keys, seqs, heads)), device=device).float()
            out = part if out is None else out + part
        if self.mask is not None and self.mask.dtype != torch.bool:
            m = _rows(self.mask, rows, T, keys, S, seqs, heads).to(device)
            part = m.masked_fill(m <= HIDDEN_AT, 0).float()
            if bool(part.any()):
                out = part if out is None else out + part
        return out

    def has_bias(self) -> bool:
        """True where something beside q·kᵀ enters the scores: a bias, or an additive mask with values
        other than 0 over the keys it leaves visible (a ``score_mod`` is told apart: it may be anything)."""
        return self.bias is not None or self.bias_mod is not None or (self.mask is not None and self.mask.dtype != torch.bool
                                         and bool((~(self.mask <= HIDDEN_AT) & (self.mask != 0)).any()))


OnCall = Callable[[AttentionCall], None]


def hidden_keys(scores_BHTS: torch.Tensor) -> torch.Tensor:
    """B×1×T×S: the keys a model hid itself in scores it computed (-inf), one mask for all its heads, as
    attnscale's models make it. A key is hidden where any head holds -inf: a broken head's score at a hidden key
    is NaN (NaN + -inf), and its visible NaN and inf scores stay visible, to read non-finite."""
    hidden = scores_BHTS[:, :1] == -math.inf
    for h in range(1, scores_BHTS.shape[1]):
        hidden |= scores_BHTS[:, h:h + 1] == -math.inf
    return hidden


def named(modules: Iterable[tuple[str, nn.Module]]) -> dict[int, str]:
    """Module id → name, to name the calls of a capture that sees only modules."""
    return {id(m): n for n, m in modules}
