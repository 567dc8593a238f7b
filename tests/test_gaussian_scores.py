"""gaussian_scores: the random-score curve against its limits and an independent Monte Carlo."""

import math

import numpy as np
import pytest
import torch

from attnscale.core.diagnostics import entropy
from attnscale.core.gaussian_scores import SPREADS, expected_effective_words, table


def _monte_carlo(spread: float, n: int, rows: int = 20_000, seed: int = 123) -> tuple[float, float]:
    """exp(E[H]) from fresh draws (another seed, torch's softmax and the package's entropy rule), and its SE."""
    gen = torch.Generator().manual_seed(seed)
    h = entropy(torch.softmax(spread * torch.randn(rows, n, generator=gen, dtype=torch.float64), -1)).double()
    mean, se = float(h.mean()), float(h.std()) / math.sqrt(rows)
    return math.exp(mean), math.exp(mean) * se


@pytest.mark.parametrize("spread", [0.5, 1.0, 2.0, 3.3, 6.0])
def test_matches_an_independent_monte_carlo(spread):
    want, se_mc = _monte_carlo(spread, 64)
    got = expected_effective_words(spread, 64)
    _, _, se_table = table(64)
    # both estimates are noisy, and between grid points the table interpolates: 4 combined SEs, or 1.5%
    assert abs(got - want) <= max(4 * math.hypot(se_mc, float(se_table.max())), 0.015 * want)


def test_limits_uniform_small_spread_and_frozen():
    assert expected_effective_words(0.0, 64) == pytest.approx(64, rel=1e-9)
    assert expected_effective_words(0.0, 32, causal=True) == pytest.approx(np.mean(np.arange(2, 33)), rel=1e-9)
    # small spread: H ≈ log n − s²/2, so words ≈ n·exp(−s²/2) (plus O(1/n))
    assert expected_effective_words(0.3, 64) == pytest.approx(64 * math.exp(-0.045), rel=0.01)
    # far past sqrt(2 log n) the row is frozen on its largest score
    assert 1.0 <= expected_effective_words(1e4, 64) < 1.2


def test_table_is_monotone_precise_and_vectorised():
    s, words, se = table(64)
    assert list(s) == list(SPREADS) and np.all(np.diff(words) < 0)
    assert float((se / words).max()) < 0.01
    out = expected_effective_words(np.array([0.0, 1.0, 50.0]), 16, causal=True)
    assert out.shape == (3,) and np.all(np.diff(out) < 0)
    with pytest.raises(ValueError, match="n must be an integer of at least 2, got 1"):
        table(1)
