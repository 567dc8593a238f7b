"""Which keys each query row of a call sees, counted: the rule for rows that see one key.

A row that sees a single key (token 0 under a causal mask, a window of one) puts
weight 1 on it whatever its score: no score of it can move a weight. Such rows
are left out of every row measure (with one choice a row is neither frozen nor
free) and of max |score| and QK-Clip's S_max (clipping on a score that moves no
weight would shrink a head for nothing). Spread counts every visible score: it
is the scale of the score distribution the lab studies, and those rows' scores
are among the scores the model makes. ``MIN_KEYS`` is the line.
"""

from __future__ import annotations

import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import _key_mask
from attnscale.capture.sums import largest_abs
from attnscale.core.diagnostics import MIN_KEYS

__all__ = ["MIN_KEYS", "counted", "counted_top", "few_key_rows", "key_counts", "largest_abs", "left_out",
           "seen_keys"]


def seen_keys(call: AttentionCall, padding_BT: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(which keys the rows may see, B'×H'×S boolean or None, H' 1 or H; which rows are real, B×T boolean or
    None) of a call whose mask is a key mask (``reduce._key_mask`` not False) and the batch's padding."""
    B, H, T, S, K = call.q.shape[0], call.heads, call.q.shape[-2], call.k.shape[-2], call.kv_heads
    keys = _key_mask(call, H, K)
    seen = None if keys is None or keys is False else keys[..., 0].to(call.q.device)
    rows = None
    if padding_BT is not None:
        pad = padding_BT.to(call.q.device).bool()
        if pad.shape[0] == B and pad.shape[1] == S:
            seen = pad[:, None] if seen is None else seen & pad[:, None]
        if pad.shape[0] == B and pad.shape[1] == T:
            rows = pad
    return seen, rows


def key_counts(call: AttentionCall, seen: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
    """The keys each query row sees, B'×H'×T int64 (broadcastable to B×H×T): its causal/window range's keys that
    ``seen`` leaves, 0 for a row that is not real."""
    T, S = call.q.shape[-2], call.k.shape[-2]
    i = torch.arange(T, device=call.q.device) + call.diagonal
    hi = (i + 1).clamp(0, S) if call.is_causal else torch.full_like(i, S)
    lo = (i - call.window + 1).clamp(0, S) if call.window is not None else torch.zeros_like(i)
    lo = torch.minimum(lo, hi)
    if seen is None:
        n = (hi - lo)[None, None]
    else:
        P = torch.nn.functional.pad(seen.long().cumsum(-1), (1, 0))  # P[..., j]: seen keys before key j
        n = P[..., hi] - P[..., lo]
    return n if rows is None else n * rows[:, None].long()


def counted(n: torch.Tensor) -> torch.Tensor:
    """The rows of key counts ``n`` that the measures count: those that see ``MIN_KEYS`` keys or more."""
    return n >= MIN_KEYS


def counted_top(s_BHRS: torch.Tensor, n_BHR: torch.Tensor) -> torch.Tensor:
    """Each head's largest |score| (H,) over a block's rows that see ``MIN_KEYS`` keys or more (``n_BHR``, the
    keys each row sees, broadcastable), hidden scores 0: a row that sees one key moves no weight."""
    return largest_abs(s_BHRS, -1).masked_fill_(~counted(n_BHR), 0.0).amax((0, 2))


def few_key_rows(call: AttentionCall, seen: torch.Tensor | None,
                 rows: torch.Tensor | None) -> slice | torch.Tensor | None:
    """The rows that see fewer than ``MIN_KEYS`` keys: None where there are none, a slice of rows where the causal
    structure alone says it (no tensor op: QK-Clip's S_max meets it at every step), else B'×H'×T boolean."""
    T, S = call.q.shape[-2], call.k.shape[-2]
    if seen is None and rows is None and call.window is None:
        if S < MIN_KEYS:
            return slice(0, T)
        stop = min(T, MIN_KEYS - 1 - call.diagonal) if call.is_causal else 0  # row i sees min(S, i + diagonal + 1)
        return slice(0, stop) if stop > 0 else None
    few = ~counted(key_counts(call, seen, rows))
    return few if bool(few.any()) else None


def left_out(s: torch.Tensor, few: slice | torch.Tensor | None, r0: int = 0, heads_first: bool = False) -> torch.Tensor:
    """``s`` (B×H×R×S from row ``r0``, or H×B×R×S where ``heads_first``) with the rows of ``few``
    (``few_key_rows``; a tensor already cut to these sequences and heads) set to 0, in place: their scores then
    raise no largest |score|."""
    if few is None:
        return s
    R = s.shape[2]
    if isinstance(few, slice):
        a, b = max(0, few.start - r0), min(R, few.stop - r0)
        if a < b:
            s[:, :, a:b] = 0.0
        return s
    mine = few[..., r0:r0 + R]
    return s.masked_fill_((mine.transpose(0, 1) if heads_first else mine)[..., None], 0.0)
