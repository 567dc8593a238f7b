"""What random scores predict: effective words of softmax over Gaussian scores.

If a row's n scores are independent N(0, s²), how many words does softmax
spread over? We tabulate exp(E[H]), H the entropy (nats) of softmax(z), as a
function of the spread s, for a row of n keys, and for the rows of a causal
head (row i sees i + 1 keys; rows that see one key are left out, as in
``diagnostics.head_summary``). A trained head whose effective words sit far
from this curve at its own spread is doing something random scores do not.

Two limits check the table: s = 0 gives n (uniform); for large n and small s,
H ≈ log n − s²/2 (E[e^z] = e^{s²/2} and E[z e^z]/E[e^z] = s²), and past
s ≈ sqrt(2 log n) the row freezes onto its largest score (the random energy
model's transition, Derrida 1981).

Why Monte Carlo and not quadrature: H couples all n scores through the
normaliser, so the expectation is an n-dimensional integral (n = 64 here) with
no one-dimensional reduction in closed form. A fixed-seed Monte Carlo with
``SAMPLES`` rows per spread is deterministic, and its standard error of E[H] is
below 1% of exp(E[H]) at every tabulated spread (0.65% at most for n = 64) (``table`` returns it; the
tests check it). The same draws serve every spread (common random numbers),
so the tabulated curve is smooth and monotone; between grid points we
interpolate log(effective words) linearly in s.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["SAMPLES", "SPREADS", "table", "expected_effective_words"]

SAMPLES = 10_000
SEED = 0
# fine where the curve bends (s below 4), coarser out to 24, past which every row of <= 1,024 keys is frozen
SPREADS = tuple(np.round(np.concatenate([np.arange(0, 4, 0.1), np.arange(4, 8, 0.5), np.arange(8, 24.01, 2.0)]), 4))


def _entropies(z: np.ndarray, causal: bool) -> np.ndarray:
    """Entropy of softmax over each row of ``z`` (samples × n), or, with ``causal``,
    over every prefix of 2 … n columns of each row (samples × (n − 1)).

    H = log Σe^z − Σ e^z z / Σe^z, with z shifted by its row maximum M; a prefix's
    own maximum may sit below M, but by at most the row's range (< 250 at the
    table's largest spread), far above float64's underflow at −745."""
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    if causal:
        total, weighted = np.cumsum(e, axis=1)[:, 1:], np.cumsum(e * z, axis=1)[:, 1:]
    else:
        total, weighted = e.sum(axis=1), (e * z).sum(axis=1)
    return np.log(total) - weighted / total


@lru_cache(maxsize=32)
def table(n: int, causal: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(spreads, expected effective words, its standard error) for rows of ``n`` keys.

    Effective words is exp(E[H]); with ``causal`` the mean over rows of 2 … n
    keys of each row's exp(E[H]). Computed once per (n, causal) and kept."""
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer of at least 2, got {n!r}")
    rng = np.random.default_rng(SEED)
    base = rng.standard_normal((SAMPLES, int(n)))
    words, ses = [], []
    for s in SPREADS:
        h = _entropies(s * base, causal)  # samples, or samples × rows
        mean_h = h.mean(axis=0)
        se_h = h.std(axis=0, ddof=1) / np.sqrt(SAMPLES)
        eff = np.exp(mean_h)
        words.append(eff.mean())
        ses.append((eff * se_h).mean())  # delta method: SE of exp(m) ≈ exp(m)·SE(m)
    return np.asarray(SPREADS, dtype=float), np.asarray(words), np.asarray(ses)


def expected_effective_words(spread, n: int, causal: bool = False):
    """exp(E[H]) of softmax over ``n`` scores drawn i.i.d. N(0, spread²), interpolated
    from ``table``; a spread past the table's end gets the end's value (frozen rows).
    Takes a number or an array; returns the same shape."""
    s_grid, words, _ = table(int(n), bool(causal))
    s = np.clip(np.asarray(spread, dtype=float), 0.0, s_grid[-1])
    out = np.exp(np.interp(s, s_grid, np.log(words)))
    return float(out) if out.ndim == 0 else out
