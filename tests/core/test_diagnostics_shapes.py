"""core.diagnostics on 2-D, 3-D and 4-D inputs: every public measure reads rows along the last dim, whatever
the leading shape, so each must equal its flattened twin (the rows one after another), and the twin must
equal the definition computed here row by row in plain float64.

The shapes keep every dim a different length, so a reduction over the wrong axis cannot line up by chance."""

import math

import pytest
import torch

from attnscale.core import diagnostics as D

SHAPES = [(30, 7), (5, 6, 7), (2, 3, 5, 7)]  # 30 rows of 7 keys, as 2-D, 3-D and 4-D


def _weights(shape, seed=0) -> torch.Tensor:
    """Rows of softmax weights of all kinds: spread out, frozen (> 0.99 on one key), and rows that see no key."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g, dtype=torch.float64)
    flat = z.reshape(-1, shape[-1])
    flat[::3] *= 20.0  # a third of the rows sharp: many frozen
    p = torch.softmax(flat, -1)
    p[4::7] = 0.0  # rows that see no key
    return p.reshape(shape).float()


def _rows_by_hand(p: torch.Tensor) -> list[list[float]]:
    return [[float(v) for v in row] for row in p.reshape(-1, p.shape[-1])]


def _entropy(row):
    return -sum(v * math.log(v) for v in row if v > 0)


def _push(row):
    """||diag(p) - p pᵀ||_F, entry by entry."""
    return math.sqrt(sum(((v if i == j else 0.0) - v * w) ** 2 for i, v in enumerate(row) for j, w in enumerate(row)))


@pytest.mark.parametrize("shape", SHAPES)
def test_row_measures_read_the_last_dim_whatever_the_leading_shape(shape):
    p = _weights(shape)
    rows = _rows_by_hand(p)
    lead = shape[:-1]
    want = {
        "valid_rows": [sum(r) > 0.5 for r in rows],
        "max_weight": [max(r) for r in rows],
        "entropy": [_entropy(r) for r in rows],
        "effective_words": [math.exp(_entropy(r)) for r in rows],
        "push": [_push(r) for r in rows],
    }
    for name, values in want.items():
        got = getattr(D, name)(p)
        assert tuple(got.shape) == lead, name
        twin = getattr(D, name)(p.reshape(-1, shape[-1]))
        assert torch.equal(got.reshape(-1), twin), name
        assert got.reshape(-1).tolist() == pytest.approx(values, rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threshold", [0.5, 0.99])
def test_frozen_fraction_is_the_share_of_seeing_rows_over_any_leading_shape(shape, threshold):
    p = _weights(shape)
    seeing = [r for r in _rows_by_hand(p) if sum(r) > 0.5]
    want = sum(max(r) > threshold for r in seeing) / len(seeing)
    assert 0 < want < 1
    assert D.frozen_fraction(p, threshold) == pytest.approx(want, abs=1e-12)


def test_frozen_fraction_of_heads_by_rows_by_keys():
    """The issue's case: 3 heads × 4 rows × 5 keys, 10 of 12 rows frozen: 0.833, not a share over another axis."""
    p = torch.full((3, 4, 5), 0.2)
    frozen = torch.tensor([0.996, 0.001, 0.001, 0.001, 0.001])
    p[:, :] = frozen
    p[0, 1] = 0.2
    p[2, 3] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    assert D.frozen_fraction(p) == pytest.approx(10 / 12, abs=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_row_summary_counts_rows_over_any_leading_shape(shape):
    p = _weights(shape)
    seeing = [r for r in _rows_by_hand(p) if sum(r) > 0.5]
    got = D.row_summary(p)
    assert got["rows"] == len(seeing) and isinstance(got["rows"], int)
    assert got["max_weight_mean"] == pytest.approx(sum(max(r) for r in seeing) / len(seeing), rel=1e-6)
    assert got["frozen_fraction"] == pytest.approx(sum(max(r) > 0.99 for r in seeing) / len(seeing), abs=1e-12)
    eff = sorted(math.exp(_entropy(r)) for r in seeing)
    assert got["effective_words_mean"] == pytest.approx(sum(eff) / len(eff), rel=1e-6)
    assert got["push_mean"] == pytest.approx(sum(_push(r) for r in seeing) / len(seeing), rel=1e-5)
    assert D.row_summary(p.reshape(-1, shape[-1])) == got


@pytest.mark.parametrize("shape", SHAPES)
def test_counted_rows_reads_the_last_dim(shape):
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(*shape, generator=g) < 0.2
    want = [sum(bool(v) for v in row) >= 2 for row in keep.reshape(-1, shape[-1])]
    got = D.counted_rows(keep)
    assert tuple(got.shape) == shape[:-1]
    assert got.reshape(-1).tolist() == want
    assert 0 < sum(want) < len(want)


def _std(values):
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def _scores(shape, seed=2):
    g = torch.Generator().manual_seed(seed)
    s = 3.0 * torch.randn(*shape, generator=g) + 1.5
    keep = torch.rand(*shape, generator=g) < 0.7
    return s, keep


def test_spread_per_head_is_each_heads_population_deviation():
    """``spread(s, dim=(0, 2, 3))``, the docstring's own call, on the CPU: one spread per head of a
    B×H×T×S tensor, over its finite, unmasked scores."""
    s, keep = _scores((2, 3, 5, 7))
    s = s.masked_fill(torch.rand(s.shape, generator=torch.Generator().manual_seed(3)) < 0.1, -math.inf)
    for mask in (None, keep):
        got = D.spread(s, mask, dim=(0, 2, 3))
        assert tuple(got.shape) == (3,)
        for h in range(3):
            sel = torch.isfinite(s[:, h]) & (True if mask is None else mask[:, h])
            assert float(got[h]) == pytest.approx(_std(s[:, h][sel].double().tolist()), rel=1e-6)
        assert torch.equal(D.spread(s, mask, dim=(-4, -2, -1)), got)  # the same dims counted from the end


@pytest.mark.parametrize("shape", SHAPES)
def test_spread_of_each_row_and_of_everything(shape):
    s, keep = _scores(shape)
    rows = [[float(v) for v, k in zip(r, kr) if k] for r, kr in zip(s.reshape(-1, shape[-1]), keep.reshape(-1, shape[-1]))]
    got = D.spread(s, keep, dim=-1)
    assert tuple(got.shape) == shape[:-1]
    assert got.reshape(-1).tolist() == pytest.approx([_std(r) for r in rows], rel=1e-5)
    assert float(D.spread(s, keep)) == pytest.approx(_std([v for r in rows for v in r]), rel=1e-6)
    lead = D.spread(s, keep, dim=0)  # over the first dim: each column of the rest
    assert tuple(lead.shape) == shape[1:]
    col = [float(v) for v, k in zip(s[(slice(None),) + (0,) * (len(shape) - 1)], keep[(slice(None),) + (0,) * (len(shape) - 1)]) if k]
    assert float(lead[(0,) * (len(shape) - 1)]) == pytest.approx(_std(col), rel=1e-5)
