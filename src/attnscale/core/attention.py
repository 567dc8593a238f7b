"""Multi-head dot-product attention, written out so every step can be watched.

Reference path (the one the diagnostics read):

    scores = scale(q, k)  ->  mask with -inf  ->  softmax in fp32  ->  @ v

The scores are fp32 in an fp16 run (q·k passes fp16's range before the scale
factor brings it down); in fp32 and bf16 they keep the inputs' dtype.

Masking rule: masked entries are -inf in ``hook_scores`` (so a reader can tell
them apart from small scores) and exactly 0 in ``hook_pattern``; a row with no
visible key gets all-zero weights rather than NaN.

The fused path, ``F.scaled_dot_product_attention``, serves when nothing is
recorded and the scheme allows it; ``test_attention.py`` checks that both give
the same outputs and gradients; a reader that needs only q, k and the mask
(``Attention.listen``: the watch's capture, QK-Clip) leaves it in place.
``Attention`` defaults to it (fp32 inference,
what a library user calls); the tiny model's training presets pick the explicit
path under bf16 autocast, and fp32 training takes the fused one on the steps
that do not record (``lm.train``). The timings behind both choices:
docs/design-notes.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnscale.core.hooks import HookPoint
from attnscale.core.scales import ScoreScale, get_scale

__all__ = ["Attention", "attend", "masked_softmax", "build_mask"]


def build_mask(T: int, causal: bool, key_padding_BT: torch.Tensor | None = None, device=None) -> torch.Tensor | None:
    """Boolean mask, True where a query may look at a key; broadcastable to B×H×T×T.

    ``key_padding_BT`` is True for real tokens and False for padding."""
    mask = None
    if causal:
        mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]
    if key_padding_BT is not None:
        pad = key_padding_BT.bool()[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return mask


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim in fp32; masked entries get weight 0, and a
    fully masked row is all zeros (not NaN)."""
    scores = scores.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    if mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return p


def attend(
    q_BHTD: torch.Tensor,
    k_BHTD: torch.Tensor,
    v_BHTD: torch.Tensor,
    scale: ScoreScale,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Explicit attention. Returns (z_BHTD, scores_BHTT after mask, pattern_BHTT)."""
    return _attend(q_BHTD, k_BHTD, v_BHTD, scale, mask, rows_may_be_empty=True)


def _in_fp16(x: torch.Tensor) -> bool:
    kind = x.device.type
    return x.dtype == torch.float16 or (torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.float16)


def _scores(scale: ScoreScale, q_BHTD: torch.Tensor, k_BHTD: torch.Tensor) -> torch.Tensor:
    """``scale.scores``, in fp32 where q·k would be computed in fp16: the product comes before
    the factor, and without a scale (or once q and k have grown) it passes fp16's largest
    number, 65,504, and becomes inf, which every reader of the scores takes for a masked entry.
    fp32 and bf16 (fp32's range) are computed as they are, their numbers unchanged."""
    if not _in_fp16(q_BHTD):
        return scale.scores(q_BHTD, k_BHTD)
    with torch.autocast(q_BHTD.device.type, enabled=False):
        return scale.scores(q_BHTD.float(), k_BHTD.float())


def _attend(q_BHTD, k_BHTD, v_BHTD, scale: ScoreScale, mask, rows_may_be_empty: bool):
    """``attend``; ``rows_may_be_empty=False`` (a causal mask, no padding: every row sees
    its own key) skips the zeroing of rows with no visible key, which would change nothing."""
    scores_BHTT = _scores(scale, q_BHTD, k_BHTD)
    if mask is not None:
        # + 0 / -inf gives masked_fill's scores exactly, and costs nothing in the backward
        # (softmax already sends no gradient where its weight is 0)
        bias = torch.zeros(mask.shape, dtype=scores_BHTT.dtype, device=scores_BHTT.device)
        scores_BHTT = scores_BHTT + bias.masked_fill_(~mask, float("-inf"))
    pattern_BHTT = torch.softmax(scores_BHTT.float(), dim=-1)  # the scores are masked already
    if mask is not None and rows_may_be_empty:
        pattern_BHTT = pattern_BHTT.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    z_BHTD = pattern_BHTT.to(v_BHTD.dtype) @ v_BHTD
    return z_BHTD, scores_BHTT, pattern_BHTT


class Attention(nn.Module):
    """Multi-head self-attention with a named score scale and hook points.

    ``head_dim`` is set apart from ``d_model`` so the width the course varies
    (the length of q and k) can be large while the residual stream stays small.
    ``impl``: "explicit" always writes the steps out; "fused" uses SDPA when
    nothing is recorded and the scheme is fusable; recording always forces
    the explicit path. ``listen(fn)``: ``fn(q_BHTD, k_BHTD, key_padding_BT)`` at every call, on either
    path (q and k as ``hook_q``/``hook_k`` see them, before the scale prepares them).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        scale: str = "inv_sqrt_d",
        causal: bool = True,
        bias: bool = False,
        impl: str = "fused",
    ):
        super().__init__()
        if impl not in ("explicit", "fused"):
            raise ValueError(f"impl must be 'explicit' or 'fused', got {impl!r}")
        self.n_heads, self.head_dim, self.causal, self.impl = n_heads, head_dim, causal, impl
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.o_proj = nn.Linear(inner, d_model, bias=bias)
        self.scale = get_scale(scale, head_dim)
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self._listeners: OrderedDict[int, Callable] = OrderedDict()

    def listen(self, fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], None]):
        """Call ``fn(q_BHTD, k_BHTD, key_padding_BT)`` at every forward, before the attention; the fused path
        stays (nothing here needs the scores). Returns a handle whose ``remove()`` stops it."""
        handle = torch.utils.hooks.RemovableHandle(self._listeners)
        self._listeners[handle.id] = fn
        return handle

    def _split(self, x_BTI: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTI.shape
        return x_BTI.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

    @property
    def recording(self) -> bool:
        return any(h.active for h in (self.hook_q, self.hook_k, self.hook_scores, self.hook_pattern, self.hook_z))

    def forward(self, x_BTC: torch.Tensor, key_padding_BT: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x_BTC.shape
        q_BHTD = self.hook_q(self._split(self.q_proj(x_BTC)))
        k_BHTD = self.hook_k(self._split(self.k_proj(x_BTC)))
        v_BHTD = self._split(self.v_proj(x_BTC))
        for fn in getattr(self, "_listeners", {}).values():  # (a module pickled before listeners had none)
            fn(q_BHTD, k_BHTD, key_padding_BT)
        if self.impl == "fused" and self.scale.fusable and not self.recording:
            z_BHTD = self._fused(q_BHTD, k_BHTD, v_BHTD, key_padding_BT)
        else:
            mask = build_mask(T, self.causal, key_padding_BT, device=x_BTC.device)
            z_BHTD, scores_BHTT, pattern_BHTT = _attend(q_BHTD, k_BHTD, v_BHTD, self.scale, mask,
                                                        rows_may_be_empty=key_padding_BT is not None)
            self.hook_scores(scores_BHTT)
            self.hook_pattern(pattern_BHTT)
        z_BHTD = self.hook_z(z_BHTD)
        return self.o_proj(z_BHTD.transpose(1, 2).reshape(B, T, -1))

    def _fused(self, q_BHTD, k_BHTD, v_BHTD, key_padding_BT):
        q_BHTD, k_BHTD = self.scale.prepare(q_BHTD, k_BHTD)
        factor = self.scale.factor()
        if isinstance(factor, torch.Tensor):  # a learned factor: SDPA's scale takes floats only
            q_BHTD, factor = q_BHTD * factor, 1.0
        if key_padding_BT is None:
            return F.scaled_dot_product_attention(q_BHTD, k_BHTD, v_BHTD, is_causal=self.causal, scale=factor)
        mask = build_mask(q_BHTD.shape[-2], self.causal, key_padding_BT, device=q_BHTD.device)
        z = F.scaled_dot_product_attention(q_BHTD, k_BHTD, v_BHTD, attn_mask=mask, scale=factor)
        # SDPA gives NaN for a row with no visible key; the explicit path gives 0.
        return z.masked_fill(~mask.any(-1, keepdim=True), 0.0)
