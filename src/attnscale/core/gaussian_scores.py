"""What random scores predict: effective words of softmax over Gaussian scores.

If a row's n scores are independent N(0, s²), how many words does softmax
spread over? We tabulate, as a function of the spread s, the statistic a head
reports of its rows' effective words exp(H) (H the entropy of softmax(z) in
nats), so that a curve and a measured point are the same statistic:

- "mean": E[exp H], the mean over rows of exp(H), what a head's recorded
  effective words are (``capture.reduce`` averages rows);
- "median": the median row's exp(H), what the fresh-head experiment reports.

(exp(E[H]) is neither, and lies below both: at 64 keys and spread 4, E[exp H]
is about 20% above it.) For a row of n keys, or for the rows of a causal head
(row i sees i + 1 keys; rows that see one key are left out, as in
the per-head reduction, and each row is drawn at its own key count).
A trained head whose effective words sit far from this curve at its own spread
is doing something random scores do not.

Two limits check the table: s = 0 gives n (uniform); for large n and small s,
H ≈ log n − s²/2 (E[e^z] = e^{s²/2} and E[z e^z]/E[e^z] = s²), and past
s ≈ sqrt(2 log n) the row freezes onto its largest score (the random energy
model's transition, Derrida 1981).

Why Monte Carlo and not quadrature: H couples all n scores through the
normaliser, so the expectation is an n-dimensional integral (n = 64 here) with
no one-dimensional reduction in closed form. A fixed-seed Monte Carlo with
``SAMPLES`` rows per spread is deterministic, and its standard error is below
1% of the statistic at every tabulated spread (``table`` returns it; the tests
check it, and check the table against a direct Monte Carlo of the same
statistic within 1% at spreads 1, 2, 4 and 8). The same draws serve every
spread (common random numbers), so the tabulated curve is smooth and
monotone; between grid points we interpolate log(effective words) linearly in s.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

__all__ = ["SAMPLES", "SPREADS", "STATISTICS", "table", "expected_effective_words"]

SAMPLES = 10_000
SEED = 0
STATISTICS = ("mean", "median")
# fine where the curve bends (s below 4), coarser out to 24, then geometric (×√2) out to 17,000: a frozen
# row's mean effective words fall to 1 only like 1 + c/s (two top scores within ~1/s of each other), and
# trained heads without the scale reach spreads in the thousands
SPREADS = tuple(np.round(np.concatenate([np.arange(0, 4, 0.1), np.arange(4, 8, 0.5), np.arange(8, 24.01, 2.0),
                                         24.0 * np.sqrt(2.0) ** np.arange(1, 20)]), 4))


def _entropies(z: np.ndarray, causal: bool) -> np.ndarray:
    """Entropy of softmax over each row of ``z`` (samples × n), or, with ``causal``,
    over every prefix of 2 … n columns of each row (samples × (n − 1)).

    H = log Σe^z − Σ e^z z / Σe^z, with z shifted by its row maximum M. A prefix's
    own maximum may sit below M by up to the row's range: below 250 up to spread 24,
    far above float64's underflow at −745, so prefixes are cumulative sums there;
    past it (spreads in the thousands) ``_prefix_entropies`` keeps each prefix's own maximum."""
    if causal and float(np.ptp(z, axis=1).max()) > 600:
        return _prefix_entropies(z)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    if causal:
        total, weighted = np.cumsum(e, axis=1)[:, 1:], np.cumsum(e * z, axis=1)[:, 1:]
    else:
        total, weighted = e.sum(axis=1), (e * z).sum(axis=1)
    return np.log(total) - weighted / total


def _prefix_entropies(z: np.ndarray) -> np.ndarray:
    """The entropy of every prefix of 2 … n columns, one column at a time with the prefix's running
    maximum M: S = Σ e^(z − M) and T = Σ e^(z − M)·z rescaled by e^(M_old − M_new) as M grows, and
    H = M + log S − T / S."""
    m, s, t = z[:, 0].copy(), np.ones(len(z)), z[:, 0].copy()
    out = np.empty((z.shape[0], z.shape[1] - 1))
    for k in range(1, z.shape[1]):
        zk = z[:, k]
        new = np.maximum(m, zk)
        old, add = np.exp(m - new), np.exp(zk - new)
        s, t, m = s * old + add, t * old + add * zk, new
        out[:, k - 1] = m + np.log(s) - t / s
    return out


def _median_and_se(x: np.ndarray) -> tuple[float, float]:
    """The median of ``x`` and its SE from the order statistics: half the distance between the values
    at ranks m/2 ± sqrt(m)/2, which bound a binomial ±1 SE of the median's rank."""
    x = np.sort(x.ravel())
    m = x.size
    half = 0.5 * math.sqrt(m)
    lo, hi = x[max(0, int(m / 2 - half))], x[min(m - 1, int(m / 2 + half))]
    return float(np.median(x)), float(hi - lo) / 2


@lru_cache(maxsize=32)
def table(n: int, causal: bool = False, statistic: str = "mean") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(spreads, expected effective words, its standard error) for rows of ``n`` keys.

    ``statistic``: "mean", E[exp H] (with ``causal``: the mean over a head's rows of 2 … n keys), or
    "median", the median row's exp(H) (with ``causal``: over all those rows). Computed once per
    (n, causal, statistic) and kept."""
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer of at least 2, got {n!r}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    rng = np.random.default_rng(SEED)
    base = rng.standard_normal((SAMPLES, int(n)))
    words, ses = [], []
    for s in SPREADS:
        eff = np.exp(_entropies(s * base, causal))  # samples, or samples × rows
        if statistic == "median":
            med, se = _median_and_se(eff)
            words.append(med)
            ses.append(se)
            continue
        per_sample = eff.mean(axis=1) if causal else eff  # a head's rows share their draws: SE over samples
        words.append(per_sample.mean())
        ses.append(per_sample.std(ddof=1) / np.sqrt(SAMPLES))
    return np.asarray(SPREADS, dtype=float), np.asarray(words), np.asarray(ses)


def expected_effective_words(spread, n: int, causal: bool = False, statistic: str = "mean"):
    """The ``statistic`` ("mean": E[exp H]; "median") of effective words of softmax over ``n`` scores
    drawn i.i.d. N(0, spread²), interpolated from ``table``; a spread past the table's end gets the end's
    value (frozen rows). Takes a number or an array; returns the same shape."""
    s_grid, words, _ = table(int(n), bool(causal), statistic)
    s = np.clip(np.asarray(spread, dtype=float), 0.0, s_grid[-1])
    out = np.exp(np.interp(s, s_grid, np.log(words)))
    return float(out) if out.ndim == 0 else out
