import math

import pytest
import torch

from attnscale.core import diagnostics as D


def test_uniform_row_has_n_effective_words_and_hand_computed_push():
    n = 8
    p = torch.full((n,), 1 / n)
    assert D.entropy(p).item() == pytest.approx(math.log(n), rel=1e-6)
    assert D.effective_words(p).item() == pytest.approx(n, rel=1e-6)
    # J = I/n - 11ᵀ/n²: diagonal entries 1/n - 1/n², off-diagonal -1/n²
    by_hand = math.sqrt(n * (1 / n - 1 / n**2) ** 2 + n * (n - 1) * (1 / n**2) ** 2)
    assert D.push(p).item() == pytest.approx(by_hand, rel=1e-6)


def test_one_hot_row_is_frozen_with_no_push():
    p = torch.zeros(1, 64)
    p[0, 41] = 1.0
    assert D.entropy(p).item() == 0.0  # 0·log 0 = 0, no NaN
    assert D.effective_words(p).item() == pytest.approx(1.0)
    assert D.push(p).item() == pytest.approx(0.0, abs=1e-7)
    assert D.frozen_fraction(p) == 1.0
    assert "100.00% of its weight on word 41" in D.describe_row(p[0], 12)


def test_push_closed_form_matches_the_jacobian():
    gen = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 10.0):
        s = torch.randn(16, generator=gen, dtype=torch.float64) * scale
        p = torch.softmax(s, -1)
        J = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)
        assert torch.allclose(J, torch.diag(p) - torch.outer(p, p))
        assert D.push(p).item() == pytest.approx(torch.linalg.matrix_norm(J).item(), rel=1e-5)


def test_gaussian_scores_match_direct_computation():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(500, 64, generator=gen, dtype=torch.float64) * 3.0
    p = torch.softmax(scores, -1)
    direct_h = -(p * p.log()).sum(-1)
    assert torch.allclose(D.entropy(p).double(), direct_h, rtol=1e-5)
    assert D.spread(scores).item() == pytest.approx(scores.std(correction=0).item(), rel=1e-6)
    assert D.spread(scores).item() == pytest.approx(3.0, rel=0.02)
    summary = D.row_summary(p)
    assert summary["effective_words_median"] == pytest.approx(direct_h.exp().median().item(), rel=1e-4)
    assert summary["frozen_fraction"] == pytest.approx((p.max(-1).values > 0.99).double().mean().item())


def test_masked_entries_never_count():
    scores = torch.tensor([[1.0, 3.0, float("-inf"), float("-inf")]])
    assert D.spread(scores).item() == pytest.approx(1.0)
    mask = torch.tensor([[True, True, False, False]])
    assert D.spread(torch.tensor([[1.0, 3.0, 100.0, -100.0]]), mask).item() == pytest.approx(1.0)


def test_rows_with_no_visible_key_are_left_out():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    s = D.row_summary(p)
    assert s["rows"] == 1
    assert s["effective_words_median"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="^no row of attention weights sees any key$"):
        D.row_summary(torch.zeros(2, 3))


def test_threshold_is_configurable_and_recorded():
    p = torch.tensor([[0.95, 0.05]])
    assert D.row_summary(p)["frozen_fraction"] == 0.0
    s = D.row_summary(p, threshold=0.9)
    assert s["frozen_fraction"] == 1.0 and s["frozen_threshold"] == 0.9


def test_rows_that_see_no_key_are_left_out_of_the_frozen_share():
    p = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.6, 0.4]])  # the middle row sees nothing: not a row
    assert D.frozen_fraction(p) == 0.5


def test_a_row_is_described_in_words_with_its_numbers():
    # weights 1/2, 1/4, 1/4: H = 1.5 ln 2, effective words 2**1.5 = 2.83
    assert D.describe_row(torch.tensor([0.5, 0.25, 0.25]), 3) == \
        "row 3 puts 50.00% of its weight on word 0 (2.8 effective words)"
    assert D.describe_row(torch.tensor([0.1, 0.9]), 7) == "row 7 puts 90.00% of its weight on word 1 (1.4 effective words)"


def test_row_summary_by_hand():
    # rows (1/2, 1/2) and (1, 0): effective words 2 and 1, push sqrt(1/2 - 1/2 + 1/4) = 1/2 and 0;
    # the effective words' quantiles interpolate (median 1.5), push's median is torch's lower middle (0)
    s = D.row_summary(torch.tensor([[0.5, 0.5], [1.0, 0.0]]))
    assert s == {"effective_words_median": pytest.approx(1.5), "effective_words_p10": pytest.approx(1.1),
                 "effective_words_p90": pytest.approx(1.9), "effective_words_mean": pytest.approx(1.5),
                 "max_weight_mean": pytest.approx(0.75), "frozen_fraction": 0.5, "frozen_threshold": 0.99,
                 "push_median": 0.0, "push_mean": pytest.approx(0.25), "rows": 2}


# ---- reduce_heads: the one reduction of per-layer/per-head numbers ---------------------------


def _grid(seed=0, layers=3, heads=5):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(layers, heads, generator=g, dtype=torch.float64) * 7).tolist()


def test_reduce_heads_is_the_plain_python_mean_and_max():
    """The numbers the report and the records were built with, to the last bit: the values
    summed in order in Python, then divided (so a rebuilt report reads the same)."""
    values = _grid()
    flat = [v for layer in values for v in layer]
    assert D.reduce_heads(values) == sum(flat) / len(flat)
    assert D.reduce_heads(values, "max") == max(flat) and D.reduce_heads(values, "min") == min(flat)
    assert D.reduce_heads(values, per_layer=True) == [sum(layer) / len(layer) for layer in values]
    assert D.reduce_heads(values, "max", per_layer=True) == [max(layer) for layer in values]


def test_reduce_heads_skips_missing_values_and_weighs_by_rows():
    values = [[1.0, None, 3.0], [None, None, None]]
    assert D.reduce_heads(values) == 2.0
    assert D.reduce_heads(values, per_layer=True)[0] == 2.0 and math.isnan(D.reduce_heads(values, per_layer=True)[1])
    assert math.isnan(D.reduce_heads([])) and math.isnan(D.reduce_heads([[]], "max"))
    # weighted: a head that counted three times the rows counts three times
    assert D.reduce_heads([[1.0, 2.0]], weights_LH=[[3.0, 1.0]]) == pytest.approx(5 / 4)
    assert D.reduce_heads([[1.0, None]], weights_LH=[[1.0, 9.0]]) == 1.0
    assert math.isnan(D.reduce_heads([[1.0]], weights_LH=[[0.0]]))
    with pytest.raises(ValueError, match="how"):
        D.reduce_heads(values, "median")


def test_spread_over_one_int_dim():
    # rows (1, 3) and (2, 2, masked): spreads 1 and 0
    s = torch.tensor([[1.0, 3.0, 5.0], [2.0, 2.0, float("-inf")]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert D.spread(s, mask, dim=1).tolist() == [1.0, 0.0]
    assert D.spread(s, mask, dim=-1).tolist() == [1.0, 0.0]


class _OnMps:
    """A stand-in for an MPS tensor: it can only say where it is and come to the CPU."""
    def __init__(self, cpu):
        self._cpu = cpu
        self.device = type("Dev", (), {"type": "mps"})()

    def cpu(self):
        return self._cpu


def test_mps_tensors_are_measured_on_the_cpu():
    # scores 1, 3 (and 2, 2 masked off by the mask): population std 1
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0])
    keep = torch.tensor([True, True, False, False])
    assert D.spread(_OnMps(scores), _OnMps(keep)).item() == 1.0
    assert D.entropy(_OnMps(torch.tensor([0.5, 0.5]))).item() == pytest.approx(math.log(2))
    cpu = torch.tensor([1.0])
    assert D._measurable(cpu) is cpu and D._measurable(None) is None


def test_a_row_counts_only_when_its_weights_sum_to_more_than_a_half():
    p = torch.tensor([[0.25, 0.25], [0.5, 0.5], [0.0, 0.0], [0.3, 0.25]])
    assert D.valid_rows(p).tolist() == [False, True, False, True]


def test_reduce_heads_per_layer_weighs_by_rows():
    # layer 0: (1·3 + 2·1) / 4 = 1.25; layer 1: (4·1 + 8·3) / 4 = 7
    values, weights = [[1.0, 2.0], [4.0, 8.0]], [[3.0, 1.0], [1.0, 3.0]]
    assert D.reduce_heads(values, per_layer=True, weights_LH=weights) == [1.25, 7.0]


def test_push_is_the_jacobians_frobenius_norm():
    """Against the Jacobian itself, differentiated by autograd: d softmax(s) / d s = diag(p) - p pᵀ."""
    gen = torch.Generator().manual_seed(5)
    for s in (torch.randn(7, generator=gen, dtype=torch.float64), 4 * torch.randn(7, generator=gen, dtype=torch.float64)):
        jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)
        assert float(D.push(torch.softmax(s, -1))) == pytest.approx(float(torch.linalg.norm(jac)), rel=1e-6)


def test_push_of_a_nearly_one_hot_row_keeps_its_digits():
    """Exact arithmetic on the row's own float64 weights: Σp² - 2Σp³ + (Σp²)² in fractions."""
    from fractions import Fraction

    p = torch.softmax(torch.tensor([0.0, -25.0, -27.0, -40.0], dtype=torch.float64), -1)
    f = [Fraction(float(x)) for x in p]
    s2, s3 = sum(x * x for x in f), sum(x**3 for x in f)
    exact = math.sqrt(s2 - 2 * s3 + s2 * s2)
    assert exact < 1e-10  # the closed form would lose every digit here in float64
    assert float(D.push(p)) == pytest.approx(exact, rel=1e-6)

