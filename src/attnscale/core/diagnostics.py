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
  the CPU (``measuring_device``, the one home of that rule), and what comes back is on the CPU.

The per-head reduction of a whole attention call (``HEAD_MEASURES``, in blocks
of query rows) is ``capture.reduce``; the rules here are its definitions, row by row.
"""

from __future__ import annotations

import math

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
    "describe_row",
    "MIN_KEYS",
    "FROZEN_HEAD_SHARE",
    "counted_rows",
    "COLLAPSED_WORDS",
    "measuring_device",
    "reduce_heads",
]

FROZEN_THRESHOLD = 0.99
# What the per-head reduction (``capture.reduce``) reports for each head, in its order: the names runs record.
HEAD_MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")
# A row that sees fewer keys than this is left out of row statistics: with one choice it is neither frozen nor free.
MIN_KEYS = 2
# A head is called frozen when more than this share of its rows is frozen.
FROZEN_HEAD_SHARE = 0.5
# A head is called collapsed when its rows spread over fewer effective words than this.
COLLAPSED_WORDS = 2.0


def measuring_device(device: torch.device | str | None) -> torch.device | str | None:
    """Where float64 sums over tensors on ``device`` are computed: the device itself, the CPU for MPS
    (which has no float64)."""
    kind = getattr(device, "type", None) or (torch.device(device).type if device is not None else None)
    return "cpu" if kind == "mps" else device


def _measurable(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` where float64 can be computed (``measuring_device``): an MPS tensor comes to the CPU."""
    return x.cpu() if x is not None and measuring_device(x.device) is not x.device else x


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
    n = keep.sum(dim=dim)  # dim None: over everything
    total = x.sum(dim=dim)
    mean = total / n
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else dim
        for d in sorted(d % x.ndim for d in dims):
            mean = mean.unsqueeze(d)
    dev = torch.where(keep, x - mean, 0.0)
    sq = dev.pow(2).sum(dim=dim)
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
    It measures how much nudging the scores can still move the weights: 0 for a one-hot row.
    Computed as p_t² R1² + 2 p_t² R2 + R2² + (R2 - 2 R3), with p_t the row's largest weight and R_n the sum
    of the other weights' n-th powers (the same number, every term ≥ 0): near a one-hot row the first
    form cancels to nothing in float64, this one keeps its digits."""
    p = _measurable(p).double()
    top, at = p.max(-1, keepdim=True)
    rest = p.scatter(-1, at, 0.0)
    r1, r2, r3 = rest.sum(-1), rest.pow(2).sum(-1), rest.pow(3).sum(-1)
    t2 = top[..., 0].pow(2)
    return (t2 * r1.pow(2) + 2 * t2 * r2 + r2.pow(2) + (r2 - 2 * r3).clamp_min(0)).sqrt().float()


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


def describe_row(p_row: torch.Tensor, row: int) -> str:
    """One row said in words: 'row 12 puts 99.98% of its weight on word 41 (1.0 effective words)'."""
    w, j = p_row.max(-1)
    eff = float(effective_words(p_row))
    return f"row {row} puts {100 * float(w):.2f}% of its weight on word {int(j)} ({eff:.1f} effective words)"


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
            return math.nan
        if how != "mean":
            return (max if how == "max" else min)(v for v, _ in pairs)
        if weights is None:
            return sum(v for v, _ in pairs) / len(pairs)
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else math.nan

    if weights_LH is None:
        weights_LH = [None] * len(values_LH)
    if per_layer:
        return [one(vals, w) for vals, w in zip(values_LH, weights_LH)]
    flat = [v for layer in values_LH for v in layer]
    weights = None if all(w is None for w in weights_LH) else [w for layer in weights_LH for w in layer]
    return one(flat, weights)
