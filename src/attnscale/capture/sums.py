"""``HeadSums``: one layer's running per-head sums, and the only code that computes the head measures.

Each block of a call's scores (``reduce.py`` makes them) is folded in at once
(``add_block``), for every measure of ``core.diagnostics.HEAD_MEASURES``:

- spread: count, mean and sum of squared deviations, merged block by block
  (Chan et al. 1979), so a large mean costs no digits;
- max_score: the running max of |score| over the rows that see ``MIN_KEYS`` keys
  (a row that sees one key moves no weight, ``capture.rows``);
- the row measures, from each row's log-sum-exp in float64 (FlashAttention's
  online softmax, with every key of a row in one block): effective words
  exp(lse - Σ p·z), max weight exp(max z - lse), push from the other keys' sums
  of p² and p³ (a form whose every term is ≥ 0, so a frozen row keeps its
  digits), frozen where the max weight passes the threshold; summed (and their
  squares, for a sampled probe's standard errors) over the rows that see
  ``MIN_KEYS`` keys;
- the bias range over the visible keys, reported apart: a bias enters the
  weights, never the scores.

An attention ``sink`` z (per head) is one more entry of every row's softmax that
is no key: over a row's visible keys the weights are
p_j = e^(z_j) / (Σ_k e^(z_k) + e^z), summing to 1 - p_sink, and the row measures
are those of these weights, the weights the model puts on its values: effective
words exp(-Σ_j p_j log p_j), the max weight max_j p_j (frozen where it passes the
threshold), push the Frobenius norm of the keys' Jacobian diag(p) - p pᵀ
(∂p_j/∂z_i, the sink held still). The sink is not a score, not in the bias
range, and not one of the ``MIN_KEYS`` keys a counted row sees.
"""

from __future__ import annotations

import math

import torch

from attnscale.core.diagnostics import FROZEN_THRESHOLD, HEAD_MEASURES, counted_rows, measuring_device

__all__ = ["ROW_MEASURES", "HeadSums", "largest_abs"]

# The measures taken over rows (the others over the scores' entries).
ROW_MEASURES = HEAD_MEASURES[2:]


def largest_abs(s: torch.Tensor, dims: tuple[int, ...] | int) -> torch.Tensor:
    """The largest |s| over ``dims``, as the larger of the max and the negated min (no |s| is made)."""
    return torch.maximum(s.amax(dims), s.amin(dims).neg_())


class HeadSums:
    """Running per-head sums of one layer, from which every head measure is read (``measures``).

    Adding blocks in any split gives the numbers of the whole call to float64 rounding; ``merge`` adds
    another layer's sums (another batch, another rank) as if their blocks had been added here."""

    FIELDS = ("entries", "mean", "m2", "max_abs", *(f"rows_{m}" for m in ROW_MEASURES),
              *(f"sum_{m}" for m in ROW_MEASURES), *(f"sq_{m}" for m in ROW_MEASURES), "bias_min", "bias_max")

    def __init__(self, heads: int, threshold: float = FROZEN_THRESHOLD, device: torch.device | str | None = None):
        self.threshold = threshold
        self.data = torch.zeros(len(self.FIELDS), heads, dtype=torch.float64, device=measuring_device(device))
        self.data[self.FIELDS.index("bias_min")] = math.inf
        self.data[self.FIELDS.index("bias_max")] = -math.inf

    def __getattr__(self, name: str) -> torch.Tensor:
        fields = type(self).FIELDS
        if name in fields:
            return self.__dict__["data"][fields.index(name)]
        raise AttributeError(name)

    @property
    def rows(self) -> torch.Tensor:
        """(H,) float64: the rows the frozen share was counted over (each row measure keeps its own count,
        ``rows_{measure}``: the fused route reads effective words from every row and the rest from a sample)."""
        return self.rows_frozen_fraction

    @property
    def heads(self) -> int:
        return self.data.shape[1]

    @property
    def device(self) -> torch.device:
        return self.data.device

    def add_block(self, scores_BHRS: torch.Tensor, keep: torch.Tensor, bias: torch.Tensor | None = None,
                  rows: bool = True, logits: torch.Tensor | None = None, sink: torch.Tensor | None = None,
                  measures: tuple[str, ...] = HEAD_MEASURES) -> None:
        """Fold one block in: ``scores`` (float32; any value where ``keep`` is False), ``keep`` (boolean,
        broadcastable: True = the key is visible to the row), ``bias`` (float32 or None) added for the weights.
        ``logits``: what the weights read where it is not scores + bias (a score_mod's output; ``bias`` then
        says what was added, for the range). ``sink``: the block's heads' sink logits (h,), or None.
        Every visible key of a row must be in the block (``rows=False``: score measures only). ``measures``:
        those of ``HEAD_MEASURES`` to add (the score measures go together), where others come from elsewhere."""
        B, H, R, S = scores_BHRS.shape
        keep = keep.expand(B, H, R, S)
        hidden = ~keep
        if "spread" in measures or "max_score" in measures:
            self._merge_scores(scores_BHRS, keep, hidden, counted_rows(keep))
        if bias is not None:
            b = bias.expand(B, H, R, S)
            self.bias_min.copy_(torch.fmin(self.bias_min, b.masked_fill(hidden, math.inf).amin((0, 2, 3)).double()))
            self.bias_max.copy_(torch.fmax(self.bias_max, b.masked_fill(hidden, -math.inf).amax((0, 2, 3)).double()))
        chosen = tuple(m for m in ROW_MEASURES if m in measures)
        if rows and chosen:
            if logits is None:
                logits = scores_BHRS if bias is None else scores_BHRS + bias
            self._add_rows(logits, keep, hidden, sink, chosen)

    def _merge_scores(self, scores: torch.Tensor, keep: torch.Tensor, hidden: torch.Tensor,
                      counted: torch.Tensor) -> None:
        """Count, mean and squared deviations of the block's visible scores, merged into the running ones, and
        the largest |score| of the rows that see ``MIN_KEYS`` keys (``counted``, B×H×R; ``capture.rows``).
        Deviations are taken from a shift near the mean (the mean so far, or the mean of the block's first row
        that sees a key) in float32, summed over each row in float32 and over rows in float64: no float64 copy
        of the block."""
        n = keep.sum((0, 2, 3)).double()
        # the first row that sees a key, per head: a row of padding first would make the shift 0, far from the mean
        B, H, R, _ = scores.shape
        at = (keep.sum(-1) > 0).transpose(0, 1).reshape(H, B * R).int().argmax(1)
        heads = torch.arange(H, device=scores.device)
        row, row_keep = scores[at // R, heads, at % R], keep[at // R, heads, at % R]  # H×S
        first = row.masked_fill(~row_keep, 0.0).sum(1).double() / row_keep.sum(1).clamp_min(1)
        shift = torch.where(self.entries > 0, self.mean, first).float()[None, :, None, None]
        d = scores.masked_fill(hidden, 0.0)  # a hidden 0 never raises a largest |score|
        top = largest_abs(d, -1).masked_fill_(~counted, 0.0).amax((0, 2))
        self.max_abs.copy_(torch.maximum(self.max_abs, top.double()))
        d = d.sub_(shift).masked_fill_(hidden, 0.0)
        s1 = d.sum(-1).double().sum((0, 2))
        s2 = d.mul_(d).sum(-1).double().sum((0, 2))
        mean = shift.flatten().double() + s1 / n.clamp_min(1)
        m2 = (s2 - s1**2 / n.clamp_min(1)).clamp_min(0)
        self._chan(n, mean, m2)

    def add_moments(self, n: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, max_abs: torch.Tensor) -> None:
        """Merge another part's score measures (float64 (H,) each: its count, mean, sum of squared deviations
        and largest |score|), made elsewhere (the fused route's one-product blocks), as a block's would be."""
        self._chan(n.to(self.data), mean.to(self.data), m2.to(self.data))
        self.max_abs.copy_(torch.maximum(self.max_abs, max_abs.to(self.data)))

    def add_rows(self, measure: str, values_BHR: torch.Tensor, counted_BHR: torch.Tensor) -> None:
        """Add one row measure's per-row values, made elsewhere (the fused route's effective words of every row),
        over the rows where ``counted`` (values elsewhere may be anything, NaN included)."""
        v = torch.where(counted_BHR, values_BHR.to(self.data), 0.0)
        getattr(self, f"rows_{measure}").add_(counted_BHR.sum((0, 2)).to(self.data))
        getattr(self, f"sum_{measure}").add_(v.sum((0, 2)))
        getattr(self, f"sq_{measure}").add_(v.pow(2).sum((0, 2)))

    def _chan(self, n: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor) -> None:
        total = self.entries + n
        delta = mean - self.mean
        share = torch.where(total > 0, n / total.clamp_min(1), 0.0)
        self.m2.add_(m2 + delta.pow(2) * self.entries * share)
        self.mean.add_(delta * share)
        self.entries.copy_(total)

    def _add_rows(self, logits: torch.Tensor, keep: torch.Tensor, hidden: torch.Tensor,
                  sink: torch.Tensor | None = None, measures: tuple[str, ...] = ROW_MEASURES) -> None:
        counted = counted_rows(keep)  # B×H×R: a row with one choice is neither frozen nor free
        # hidden keys as a number no exp survives (e^-1e30 = 0, and 0 · -1e30 = 0, where -inf would give NaN)
        filled = logits.masked_fill(hidden, -1e30)
        top, top_key = filled.max(-1, keepdim=True)
        y = filled.double().sub_(top.double())  # ≤ 0, in float64 before the top is taken off: no digit lost
        del filled
        e = y.exp()
        e.scatter_(-1, top_key, 0.0)  # the other keys' e (the top's is exactly 1): sums without cancellation
        ones = torch.ones(e.shape[-1], dtype=e.dtype, device=e.device)
        e1 = e @ ones  # row sums as matrix products: one pass each, no B×H×R×S temporaries
        e_y = (e.unsqueeze(-2) @ y.unsqueeze(-1))[..., 0, 0]
        e2 = (e.unsqueeze(-2) @ e.unsqueeze(-1))[..., 0, 0]
        e3 = (e.unsqueeze(-2) @ torch.mul(e, e, out=y).unsqueeze(-1))[..., 0, 0]  # y's memory holds e²
        del e, y
        others = e1  # Σ e over the row's entries but the top key: the other keys, and the sink
        if sink is not None:  # its e, from at most 600 nats above the top (the keys' weights are then < e^-600)
            others = e1 + (sink.double()[None, :, None] - top[..., 0].double()).clamp_max(600).exp()
        total = 1 + others  # the softmax's denominator over the top's e
        share = 1.0 if sink is None else (1 + e1) / total  # the keys' weight, 1 - p_sink
        entropy = share * torch.log1p(others) - e_y / total  # -Σ p log p over the keys, p = e / total
        max_weight = 1 / total
        # push² = p_t² (1 - p_t)² + 2 p_t² R2 + R2² + (R2 - 2 R3), R_n = Σ over the other keys of pⁿ: every
        # term ≥ 0, so a frozen row's push keeps its digits (s2 - 2 s3 + s2² cancels to nothing there)
        push_sq = ((others / total) ** 2 / total**2 + (2 * e2 + e2**2) / total**4
                   + (e2 * total - 2 * e3).clamp_min(0) / total**3)
        per_row = {
            "effective_words": entropy.exp(),
            # a NaN max weight (NaN in q or k) is neither frozen nor free: the head's share is unknown, not 0
            "frozen_fraction": torch.where(max_weight.isnan(), max_weight, (max_weight > self.threshold).double()),
            "push": push_sq.sqrt(),
            "max_weight": max_weight,
        }
        for m in measures:
            self.add_rows(m, per_row[m], counted)

    def merge(self, other: "HeadSums") -> None:
        """Add ``other``'s sums (same heads) to these."""
        o = other.data.to(self.device)
        i = {f: k for k, f in enumerate(self.FIELDS)}
        self._chan(o[i["entries"]], o[i["mean"]], o[i["m2"]])
        self.max_abs.copy_(torch.maximum(self.max_abs, o[i["max_abs"]]))
        self.bias_min.copy_(torch.fmin(self.bias_min, o[i["bias_min"]]))
        self.bias_max.copy_(torch.fmax(self.bias_max, o[i["bias_max"]]))
        additive = [k for f, k in i.items() if f.startswith(("rows_", "sum_", "sq_"))]
        self.data[additive] += o[additive]

    def measures(self) -> torch.Tensor:
        """float64 (len(HEAD_MEASURES), H) on the sums' device; NaN where a head saw no entry (spread) or
        counted no row (max |score| and the row measures: ``capture.rows``' rule)."""
        seen = self.entries > 0
        spread = torch.where(seen, (self.m2 / self.entries.clamp_min(1)).sqrt(), math.nan)
        out = [spread, torch.where(seen & (self.rows_effective_words > 0), self.max_abs, math.nan)]
        for m in ROW_MEASURES:
            rows = getattr(self, f"rows_{m}")
            out.append(torch.where(rows > 0, getattr(self, f"sum_{m}") / rows.clamp_min(1), math.nan))
        return torch.stack(out)

    def standard_errors(self) -> torch.Tensor:
        """float64 (len(ROW_MEASURES), H): each row measure's standard error as a mean over sampled rows
        (sample standard deviation / sqrt(rows)); NaN under two rows. For rows sampled from a sequence, an
        upper bound: the finite-population correction is left out."""
        out = []
        for m in ROW_MEASURES:
            n = getattr(self, f"rows_{m}")
            mean = getattr(self, f"sum_{m}") / n.clamp_min(1)
            var = (getattr(self, f"sq_{m}") - n * mean**2).clamp_min(0) / (n - 1).clamp_min(1)
            out.append(torch.where(n > 1, (var / n.clamp_min(1)).sqrt(), math.nan))
        return torch.stack(out)

    def bias_range(self) -> torch.Tensor:
        """float64 (2, H): the smallest and largest bias over the visible keys; NaN where there is none."""
        lo, hi = self.bias_min, self.bias_max
        none = ~torch.isfinite(lo)
        return torch.stack([lo.masked_fill(none, math.nan), hi.masked_fill(none, math.nan)])
