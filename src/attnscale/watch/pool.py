"""From captured q and k to per-head numbers: scores in fp32, pooled per head.

``Scores`` recomputes one call's scores from its q and k as the model does,

    scores = cap(q @ kᵀ × factor) + bias,   masked where the model masks,

in float32 whatever the model runs in, with GQA's groups repeated, and pools
them into a ``core.diagnostics.HeadPool``: the spread and largest |score| over
the entries that count, and the row measurements over the rows that see at
least two keys (gathered once as N rows × H heads, so a head-shared mask costs
one softmax over the rows that count). ``LayerPools`` does this for every call
of a probe, on one device, and reads the numbers back in one transfer.
"""

from __future__ import annotations

import torch

from attnscale.core import diagnostics as D
from attnscale.core.diagnostics import FROZEN_THRESHOLD, HEAD_MEASURES
from attnscale.errors import ConfigError
from attnscale.watch.capture import AttentionCall

__all__ = ["LayerPools", "Scores", "head_max", "padding_mask"]

# The measures taken over the scores' entries; the others are taken over rows.
SCORE_MEASURES = ("spread", "max_score")
# A call's B×H×T×S scores are pooled in slices of the batch of at most this many entries.
CHUNK_ENTRIES = 1 << 26


def _four_d(x: torch.Tensor | None) -> torch.Tensor | None:
    while x is not None and x.ndim < 4:
        x = x[None]
    return x


class Scores:
    """One call's q·kᵀ in float32 (B×H×T×S), its mask and what the model does to
    the scores, ready to be pooled under any factor (the model's own, or a what-if).

    ``visible``: boolean, broadcastable to B×H×T×S (None: every key); a mask
    shared by the heads (B×1×T×S) takes the fast path that gathers the rows
    that count once for all heads and factors."""

    def __init__(self, q_BHTD: torch.Tensor, k_BKSD: torch.Tensor, visible: torch.Tensor | None = None,
                 cap=None, bias: torch.Tensor | None = None):
        H, K = q_BHTD.shape[1], k_BKSD.shape[1]
        if K != H:  # GQA: query head h reads kv head h // (H / K), as repeat_kv does
            if H % K:
                raise ConfigError(f"{H} query heads cannot share {K} key heads evenly; give q as B×H×T×D and k as B×K×S×D")
            k_BKSD = k_BKSD.repeat_interleave(H // K, dim=1)
        self.raw_BHTS = q_BHTD.float() @ k_BKSD.float().transpose(-2, -1)
        B, _, T, S = self.raw_BHTS.shape
        visible = _four_d(visible)
        if visible is None:
            visible = torch.ones(1, 1, T, S, dtype=torch.bool, device=self.raw_BHTS.device)
        self.mask = visible.to(self.raw_BHTS.device).expand(B, visible.shape[1], T, S)
        self.cap = cap
        self.bias = None if bias is None else _four_d(bias).to(self.raw_BHTS.device).float().expand(B, -1, T, S)
        self.shared = self.mask.shape[1] == 1
        self._gathered = False

    def _gather(self) -> None:
        """The rows that count (diagnostics.counted_rows), once, as N rows × H heads × S keys (shared masks only;
        made on the first ``pool``, so a caller that needs only the scores never pays for it)."""
        if self._gathered:
            return
        B, H, T, S = self.raw_BHTS.shape
        self.rows_BT = D.counted_rows(self.mask[:, 0])
        self.raw_NHS = self.raw_BHTS.permute(0, 2, 1, 3)[self.rows_BT]
        seen_NS = self.mask[:, 0][self.rows_BT]
        self.mask_bias_N1S = torch.zeros(seen_NS.shape, device=self.raw_BHTS.device).masked_fill(~seen_NS, float("-inf"))[:, None]
        self.bias_NHS = None if self.bias is None else self.bias.expand(B, H, T, S).permute(0, 2, 1, 3)[self.rows_BT]
        self._gathered = True

    def _squash(self, scores: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.cap is not None:
            scores = self.cap(scores)
        return scores if bias is None else scores + bias

    def scaled(self, factor) -> torch.Tensor:
        """The scores under ``factor`` before the mask, B×H×T×S."""
        return self._squash(self.raw_BHTS * factor, self.bias)

    def masked(self, factor) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores with masked entries -inf, weights) under ``factor``: the reference path."""
        from attnscale.core.attention import masked_softmax

        scores = self.scaled(factor).masked_fill(~self.mask, float("-inf"))
        return scores, masked_softmax(scores, self.mask)

    def pool(self, pool: D.HeadPool, factor) -> None:
        """Add these scores under ``factor`` to ``pool``."""
        if not self.shared:  # a mask per head: the plain path, one softmax per head
            pool.add(*self.masked(factor))
            return
        pool.add_scores(self.scaled(factor), self.mask)
        self._gather()
        scaled_NHS = self._squash(self.raw_NHS * factor, self.bias_NHS)
        pool.add_rows(torch.softmax(scaled_NHS + self.mask_bias_N1S, dim=-1))


def head_max(call: AttentionCall) -> torch.Tensor:
    """Per head, the largest |scaled score| of one call over the entries its mask lets count: (H,) float32
    on the call's device, as a probe's ``max_score`` takes it, without the rest of a probe's measuring
    (no softmax, no float64 sums). What QK-Clip needs from every training step."""
    with torch.no_grad():
        q, k = call.q.detach(), call.k.detach()
        visible, bias = _four_d(call.visible()), _four_d(call.bias)
        factor = call.factor.detach() if isinstance(call.factor, torch.Tensor) else call.factor
        B, H, T, S = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
        out = torch.zeros(H, device=q.device)
        step = max(1, CHUNK_ENTRIES // max(1, H * T * S))
        for start in range(0, B, step):
            scores = Scores(q[start:start + step], k[start:start + step], _slice(visible, start, start + step),
                            call.squash(), _slice(bias, start, start + step))
            kept = scores.scaled(factor).masked_fill(~scores.mask, 0.0)
            out = torch.maximum(out, kept.abs().amax((0, 2, 3)))
    return out


def padding_mask(call: AttentionCall, padding_BT: torch.Tensor | None) -> torch.Tensor | None:
    """The call's mask, with the padding of the batch (B×T, True = a real token)
    taken out of its rows and keys where their lengths are the batch's: padding
    is never a row nor a key that counts."""
    visible = _four_d(call.visible())
    if padding_BT is None:
        return visible
    pad = padding_BT.to(call.q.device).bool()
    T, S = call.q.shape[-2], call.k.shape[-2]
    if pad.shape[0] != call.q.shape[0] or pad.shape[1] not in (T, S):
        return visible
    out = torch.ones(1, 1, T, S, dtype=torch.bool, device=call.q.device) if visible is None else visible
    if pad.shape[1] == T:
        out = out & pad[:, None, :, None]
    if pad.shape[1] == S:
        out = out & pad[:, None, None, :]
    return out


def _slice(x: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return x if x is None or x.shape[0] == 1 else x[start:stop]


class LayerPools:
    """Per-head numbers of every attention call of a probe, one ``HeadPool`` per call
    (a layer), all on one device: the first call's (the CPU for MPS, which has no float64)."""

    def __init__(self, threshold: float = FROZEN_THRESHOLD):
        self.threshold = threshold
        self.device: torch.device | None = None
        self.pools: list[D.HeadPool] = []
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self.pools)

    def add(self, call: AttentionCall, padding_BT: torch.Tensor | None = None) -> None:
        if self.device is None:
            self.device = torch.device("cpu") if call.q.device.type == "mps" else call.q.device
        dev = self.device
        with torch.no_grad():
            q, k = call.q.detach().to(dev), call.k.detach().to(dev)
            visible = padding_mask(call, padding_BT)
            visible = None if visible is None else visible.to(dev)
            bias = None if call.bias is None else call.bias.detach().to(dev)
            factor = call.factor.detach().to(dev) if isinstance(call.factor, torch.Tensor) else call.factor
            B, H, T, S = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
            pool = D.HeadPool(H, self.threshold, dev)
            step = max(1, CHUNK_ENTRIES // max(1, H * T * S))
            for start in range(0, B, step):
                stop = start + step
                Scores(q[start:stop], k[start:stop], _slice(_four_d(visible), start, stop), call.squash(),
                       _slice(_four_d(bias), start, stop)).pool(pool, factor)
        self.pools.append(pool)
        self.names.append(call.name or f"call {len(self.names)}")

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (layers, len(HEAD_MEASURES), heads) float32, rows (layers, heads) float64), on the
        CPU, in one transfer. A head a layer lacks (layers of fewer heads) is NaN with 0 rows, and so
        are the row measurements of a head that counted no row."""
        heads = max(p.rows.shape[0] for p in self.pools)
        L, M = len(self.pools), len(HEAD_MEASURES)
        values = torch.full((L, M, heads), float("nan"), dtype=torch.float64, device=self.device)
        rows = torch.zeros(L, heads, dtype=torch.float64, device=self.device)
        entries = torch.zeros(L, heads, dtype=torch.float64, device=self.device)
        for i, p in enumerate(self.pools):
            h = p.rows.shape[0]
            values[i, :, :h] = p.measures()
            rows[i, :h], entries[i, :h] = p.rows, p.entries
        score = torch.tensor([m in SCORE_MEASURES for m in HEAD_MEASURES], device=self.device)[None, :, None]
        unseen = torch.where(score, (entries == 0)[:, None, :], (rows == 0)[:, None, :])
        values = values.masked_fill(unseen, float("nan"))
        flat = torch.cat([values.flatten(), rows.flatten()]).cpu()  # the probe's one read-back
        return flat[: values.numel()].view(L, M, heads).float(), flat[values.numel():].view(L, heads)
