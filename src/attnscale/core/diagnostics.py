"""The measurements, as pure functions: tensors in, numbers out.

Conventions, written once here:
- A masked score is -inf (what ``hook_scores`` holds) or is named by a boolean
  ``mask`` (True = counts). Masked entries never count.
- A row of weights ``p`` sums to 1 over its visible keys; a row with no visible
  key (all zeros) is not a row and is left out of every row statistic. Where the
  scores are at hand (``head_summary``), rows that see a single key (the first
  row under a causal mask) are left out too: with one choice a row is neither
  frozen nor free, and counting it would call every causal head partly frozen.
- Entropy is in nats with 0·log 0 = 0, so a one-hot row has entropy 0.
- Sums run in float64, which Apple's MPS lacks: tensors on MPS are measured on
  the CPU (``_measurable``), and what comes back is on the CPU.
"""

from __future__ import annotations

import torch

__all__ = [
    "FROZEN_THRESHOLD",
    "HEAD_MEASURES",
    "spread",
    "entropy",
    "effective_words",
    "max_weight",
    "push",
    "valid_rows",
    "frozen_fraction",
    "row_summary",
    "head_summary",
    "head_measures",
    "describe_row",
    "MIN_KEYS",
    "FROZEN_HEAD_SHARE",
    "counted_rows",
    "HeadPool",
    "COLLAPSED_WORDS",
    "reduce_heads",
]

FROZEN_THRESHOLD = 0.99
# What ``head_summary`` reports for each head, in its order: the names runs record.
HEAD_MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")
# A row that sees fewer keys than this is left out of row statistics: with one choice it is neither frozen nor free.
MIN_KEYS = 2
# A head is called frozen when more than this share of its rows is frozen.
FROZEN_HEAD_SHARE = 0.5
# A head is called collapsed when its rows spread over fewer effective words than this.
COLLAPSED_WORDS = 2.0


def _measurable(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` where float64 can be computed: MPS tensors come to the CPU (MPS has no float64)."""
    return x.cpu() if x is not None and x.device.type == "mps" else x


def _counted(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    keep = torch.isfinite(scores)
    if mask is not None:
        keep = keep & mask.expand_as(scores)
    return keep


def spread(scores: torch.Tensor, mask: torch.Tensor | None = None, dim=None) -> torch.Tensor:
    """Standard deviation (population, ddof 0) of the scores that count.

    With ``dim=None`` over all entries; otherwise over ``dim`` (an int or tuple),
    e.g. ``spread(scores_BHTT, dim=(0, 2, 3))`` gives one spread per head."""
    x, mask = _measurable(scores).double(), _measurable(mask)
    keep = _counted(x, mask)
    x = torch.where(keep, x, 0.0)
    n = keep.sum(dim=dim) if dim is not None else keep.sum()
    total = x.sum(dim=dim) if dim is not None else x.sum()
    mean = total / n
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else dim
        for d in sorted(d % x.ndim for d in dims):
            mean = mean.unsqueeze(d)
    dev = torch.where(keep, x - mean, 0.0)
    sq = dev.pow(2).sum(dim=dim) if dim is not None else dev.pow(2).sum()
    return (sq / n).sqrt().float()


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H(p) = -Σ p log p over the last dim, in nats, with 0·log 0 = 0."""
    return torch.special.entr(_measurable(p).double()).sum(-1).float()


def effective_words(p: torch.Tensor) -> torch.Tensor:
    """exp(H(p)): how many words a row spreads over. Uniform over n gives n; one-hot gives 1."""
    return entropy(p).exp()


def max_weight(p: torch.Tensor) -> torch.Tensor:
    return p.max(-1).values


def push(p: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the softmax Jacobian diag(p) - p pᵀ, in closed form:

    ||J||_F² = Σ_ij (δ_ij p_i - p_i p_j)² = Σp² - 2Σp³ + (Σp²)².
    It measures how much nudging the scores can still move the weights: 0 for a one-hot row."""
    p = _measurable(p).double()
    s2 = p.pow(2).sum(-1)
    s3 = p.pow(3).sum(-1)
    return (s2 - 2 * s3 + s2.pow(2)).clamp_min(0).sqrt().float()


def valid_rows(p: torch.Tensor) -> torch.Tensor:
    """True for rows that see at least one key (their weights sum to 1, not 0)."""
    return p.sum(-1) > 0.5


def frozen_fraction(p: torch.Tensor, threshold: float = FROZEN_THRESHOLD) -> float:
    """Share of rows whose largest weight exceeds ``threshold``."""
    p = _measurable(p)
    rows = valid_rows(p)
    return float((max_weight(p)[rows] > threshold).double().mean())


def _quantiles(x: torch.Tensor, qs) -> list[float]:
    return torch.quantile(x.double(), torch.tensor(qs, dtype=torch.float64)).tolist()


def row_summary(p: torch.Tensor, threshold: float = FROZEN_THRESHOLD) -> dict[str, float]:
    """Summaries over every row of ``p`` (any leading shape; rows are the last dim)."""
    p = _measurable(p)
    rows = valid_rows(p)
    if not bool(rows.any()):
        raise ValueError("no row of attention weights sees any key")
    flat = p[rows]
    eff = effective_words(flat)
    mw = max_weight(flat)
    pu = push(flat)
    p10, med, p90 = _quantiles(eff, [0.1, 0.5, 0.9])
    return {
        "effective_words_median": med,
        "effective_words_p10": p10,
        "effective_words_p90": p90,
        "effective_words_mean": float(eff.mean()),
        "max_weight_mean": float(mw.mean()),
        "frozen_fraction": float((mw > threshold).double().mean()),
        "frozen_threshold": threshold,
        "push_median": float(pu.median()),
        "push_mean": float(pu.mean()),
        "rows": int(flat.shape[0]),
    }


def counted_rows(keep: torch.Tensor) -> torch.Tensor:
    """True for the rows of a boolean ``keep`` (True = the entry counts; rows are
    the last dim) that see at least ``MIN_KEYS`` keys: the rows row statistics count."""
    return keep.sum(-1) >= MIN_KEYS


def head_summary(scores_BHTT: torch.Tensor, pattern_BHTT: torch.Tensor, threshold: float = FROZEN_THRESHOLD) -> dict[str, list[float]]:
    """Per-head measurements of one attention layer, each a list of length H.

    spread and max |score| over the scores that count; effective words, push
    and max weight averaged over rows that see at least two keys; frozen
    fraction of those rows."""
    values = head_measures(scores_BHTT, pattern_BHTT, threshold).tolist()
    return dict(zip(HEAD_MEASURES, values))


def head_measures(scores_BHTT: torch.Tensor, pattern_BHTT: torch.Tensor, threshold: float = FROZEN_THRESHOLD) -> torch.Tensor:
    """``head_summary`` as one fp32 tensor of shape (len(HEAD_MEASURES), H), on the
    tensors' device (the CPU for MPS): a caller on a GPU reads many layers back in one transfer."""
    scores_BHTT, pattern_BHTT = _measurable(scores_BHTT), _measurable(pattern_BHTT)
    keep = torch.isfinite(scores_BHTT)
    rows_BHT = valid_rows(pattern_BHTT) & counted_rows(keep)
    n_rows = rows_BHT.sum((0, 2)).clamp_min(1).double()

    def row_mean(x_BHT):
        return (torch.where(rows_BHT, x_BHT.double(), 0.0).sum((0, 2)) / n_rows).float()

    abs_scores = torch.where(keep, scores_BHTT.abs().float(), 0.0)
    by_name = {
        "spread": spread(scores_BHTT, dim=(0, 2, 3)),
        "max_score": abs_scores.amax((0, 2, 3)),
        **{k: row_mean(v_BHT) for k, v_BHT in _row_stats(pattern_BHTT, threshold).items()},
    }
    return torch.stack([by_name[k].float() for k in HEAD_MEASURES])


def describe_row(p_row: torch.Tensor, row: int) -> str:
    """One row said in words: 'row 12 puts 99.98% of its weight on word 41 (1.0 effective words)'."""
    w, j = p_row.max(-1)
    eff = float(effective_words(p_row))
    return f"row {row} puts {100 * float(w):.2f}% of its weight on word {int(j)} ({eff:.1f} effective words)"


def _row_stats(p: torch.Tensor, threshold: float) -> dict[str, torch.Tensor]:
    """Per row of ``p``: what ``head_summary`` averages over rows, in its order."""
    mw = max_weight(p)
    return {"effective_words": effective_words(p), "frozen_fraction": (mw > threshold).float(),
            "push": push(p), "max_weight": mw}


class HeadPool:
    """``head_summary``'s per-head numbers, pooled over batches, so a long text
    never needs all its scores and weights at once.

    Per head it keeps sums: of the scores that count, of their squares, the
    largest |score|, the rows counted and each row measurement's total. The
    spread is then sqrt(E[x²] - mean²), with the sums in float64 (in float32 the
    difference loses its digits when the scores have a large mean). Pooling
    ``add`` over batches gives ``head_summary`` on the batches concatenated."""

    def __init__(self, heads: int, threshold: float = FROZEN_THRESHOLD, device: torch.device | str | None = None):
        if device is not None and torch.device(device).type == "mps":
            device = "cpu"  # float64 sums: MPS has none, so its scores are pooled on the CPU

        def zeros():  # on the scores' device: the sums never leave it until ``result``
            return torch.zeros(heads, dtype=torch.float64, device=device)

        self.threshold = threshold
        self.entries, self.rows = zeros(), zeros()
        self.sum, self.sum_sq, self.max_abs = zeros(), zeros(), zeros()
        self.row_sums = {k: zeros() for k in HEAD_MEASURES[2:]}

    def add(self, scores_BHTT: torch.Tensor, pattern_BHTT: torch.Tensor) -> None:
        """One batch as ``head_summary`` takes it: masked scores are -inf; rows
        count where they see at least ``MIN_KEYS`` keys and their weights sum to 1."""
        scores_BHTT, pattern_BHTT = _measurable(scores_BHTT), _measurable(pattern_BHTT)
        keep_BHTT = torch.isfinite(scores_BHTT)
        self.add_scores(scores_BHTT, keep_BHTT)
        rows_BHT = valid_rows(pattern_BHTT) & counted_rows(keep_BHTT)
        self.rows += rows_BHT.sum((0, 2)).double()
        for k, v_BHT in _row_stats(pattern_BHTT, self.threshold).items():
            self.row_sums[k] += torch.where(rows_BHT, v_BHT, 0.0).sum((0, 2)).double()

    def add_scores(self, scores_BHTT: torch.Tensor, keep: torch.Tensor) -> None:
        """Spread and max |score| sums over the entries where the boolean ``keep``
        (broadcastable to B×H×T×T) is True; what it leaves out never counts."""
        scores_BHTT, keep = _measurable(scores_BHTT), _measurable(keep)
        x_BHTT = torch.where(keep, scores_BHTT, 0.0).double()
        self.entries += keep.expand_as(scores_BHTT).sum((0, 2, 3)).double()
        self.sum += x_BHTT.sum((0, 2, 3))
        self.sum_sq += x_BHTT.pow(2).sum((0, 2, 3))
        self.max_abs = torch.maximum(self.max_abs, x_BHTT.abs().amax((0, 2, 3)))

    def add_rows(self, pattern_NHT: torch.Tensor) -> None:
        """Row measurements of N rows × H heads that all count (gathered by the
        caller with ``counted_rows``), e.g. only the real rows of a padded batch."""
        pattern_NHT = _measurable(pattern_NHT)
        self.rows += pattern_NHT.shape[0]
        for k, v_NH in _row_stats(pattern_NHT, self.threshold).items():
            self.row_sums[k] += v_NH.sum(0).double()

    def measures(self) -> torch.Tensor:
        """``result`` as one float64 tensor of shape (len(HEAD_MEASURES), H), left on
        the sums' device, so a caller can read many pools back in one transfer."""
        n, rows = self.entries.clamp_min(1.0), self.rows.clamp_min(1.0)
        mean = self.sum / n
        out = {"spread": (self.sum_sq / n - mean**2).clamp_min(0).sqrt(), "max_score": self.max_abs}
        out.update({k: v / rows for k, v in self.row_sums.items()})
        return torch.stack([out[k] for k in HEAD_MEASURES])

    def result(self) -> dict[str, list[float]]:
        """Per head, in ``HEAD_MEASURES`` order; zeros for a head that saw nothing."""
        return dict(zip(HEAD_MEASURES, self.measures().tolist()))


def reduce_heads(values_LH, how: str = "mean", *, per_layer: bool = False, weights_LH=None):
    """Per-layer/per-head numbers (``values_LH[layer][head]``, None where a head has
    no value) in one number, or with ``per_layer`` one per layer (over its heads).

    ``how``: "mean", "max" or "min"; ``weights_LH`` (same shape) weighs the mean,
    e.g. by the rows each head counted. Values are taken in order and summed in
    Python, so the same numbers always give the same result; nothing to reduce
    gives NaN. Every per-layer/per-head summary in attnscale goes through here."""
    if how not in ("mean", "max", "min"):
        raise ValueError(f"how must be 'mean', 'max' or 'min', got {how!r}")

    def one(vals, weights=None):
        pairs = [(v, 1 if weights is None else weights[i]) for i, v in enumerate(vals) if v is not None]
        if not pairs:
            return float("nan")
        if how != "mean":
            return (max if how == "max" else min)(v for v, _ in pairs)
        if weights is None:
            return sum(v for v, _ in pairs) / len(pairs)
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else float("nan")

    if weights_LH is None:
        weights_LH = [None] * len(values_LH)
    if per_layer:
        return [one(vals, w) for vals, w in zip(values_LH, weights_LH)]
    flat = [v for layer in values_LH for v in layer]
    weights = None if all(w is None for w in weights_LH) else [w for layer in weights_LH for w in layer]
    return one(flat, weights)
