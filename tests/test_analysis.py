"""analysis: means, standard errors and the gap table, on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from attnscale.report import analysis


def _row(width, scale, seed, ppl, status="done", lr=None):
    return {"width": width, "scale": scale, "seed": seed, "lr": lr, "valid_ppl": ppl, "status": status}


def test_mean_and_se_of_the_mean():
    assert analysis.mean([1.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError, match="mean of no values"):
        analysis.mean([])
    m, se = analysis.mean_se([1.0, 2.0, 6.0])  # sample std sqrt(7), SE sqrt(7/3)
    assert m == 3.0 and math.isclose(se, math.sqrt(7 / 3))
    assert analysis.mean_se([4.0]) == (4.0, None)  # one value: no noise estimate
    assert analysis.mean_se([]) == (None, None)


def test_spread_and_binomial_se():
    # relative SE of the sample std of q·k: ½·sqrt((2 + 6/d)/n); at d = 4, n = 100: ½·sqrt(3.5/100)
    assert math.isclose(analysis.spread_se(4, 100), 0.5 * math.sqrt(0.035) * 2)
    assert math.isclose(analysis.binomial_se(0.7, 12_800), math.sqrt(0.21 / 12_800))
    assert analysis.binomial_se(0.0, 100) > 0  # a 0% share still has a width
    assert analysis.within(22.0, 21.0, 0.05) and not analysis.within(22.2, 21.0, 0.05)


def test_gap_table_pairs_seeds_and_takes_the_se_of_the_differences():
    rows = [_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, 11.0),
            _row(64, "inv_sqrt_d", 1, 12.0), _row(64, "none", 1, 15.0),
            _row(64, "none", 2, 99.0)]  # seed 2 has no partner: left out
    table = analysis.gap_table(rows)
    (r,) = table["rows"]
    # differences 1 and 3: mean 2, sample std sqrt(2), SE 1
    assert r["seeds"] == 2 and r["gap"] == 2.0 and math.isclose(r["gap_se"], 1.0)
    assert r["baseline_ppl"] == 13.0 and r["reference_ppl"] == 11.0
    assert r["counts"] is False  # 2 > 1 point, but not above 2 SE
    assert analysis.gap_by_width(table) == {64: (2.0, r["gap_se"], 2)}


def test_gap_starts_where_every_wider_width_has_a_gap():
    gaps = {32: 1.5, 64: 0.5, 128: 2.0, 256: 17.0}  # 32 has a gap, 64 breaks the run: start at 128
    rows = [x for d, g in gaps.items() for x in (_row(d, "inv_sqrt_d", 0, 40.0), _row(d, "none", 0, 40.0 + g))]
    table = analysis.gap_table(rows)
    assert [r["counts"] for r in table["rows"]] == [True, False, True, True]
    assert table["gap_starts_at"] == analysis.first_start(table) == 128
    assert table["rule"] == analysis.GAP_RULE


def test_diverged_baseline_counts_as_a_gap_and_unfinished_runs_are_left_out():
    rows = [_row(512, "inv_sqrt_d", 0, 40.0), _row(512, "none", 0, None, status="diverged"),
            _row(1024, "inv_sqrt_d", 0, 40.0), _row(1024, "none", 0, None, status="running")]
    table = analysis.gap_table(rows)
    (r,) = table["rows"]
    assert r["width"] == 512 and r["diverged"] == "baseline" and r["gap"] is None and r["counts"]
    assert analysis.gap_by_width(table) == {}  # no number to show


def test_learning_rates_get_their_own_start():
    rows = []
    for lr, gap in ((1e-3, 3.0), (1e-2, 0.2)):
        for d in (64, 256):
            rows += [_row(d, "inv_sqrt_d", 0, 40.0, lr=lr), _row(d, "none", 0, 40.0 + gap, lr=lr)]
    table = analysis.gap_table(rows)
    assert table["starts"] == [{"lr": 1e-3, "width": 64}, {"lr": 1e-2, "width": None}]
    assert table["gap_starts_at"] is None  # two learning rates: no single answer
    assert analysis.gap_by_width(table) == {64: (3.0, None, 1), 256: (3.0, None, 1)}  # the first lr's


def test_plus_minus_writes_a_mean_and_its_se():
    assert analysis.plus_minus(1.23456, 0.01234) == "1.235 ± 0.012"
    assert analysis.plus_minus(1.23456, 0.01234, terminal=True) == "1.235 ±0.012"
    assert analysis.plus_minus(2.0, None) == "2.000" and analysis.plus_minus(2.0, None, terminal=True) == "2.000"
    assert analysis.plus_minus(None, 0.1) == "—" and analysis.plus_minus(None, None, terminal=True) == "-"
    assert analysis.plus_minus(7.25, 0.5, "{:.1f}") == "7.2 ± 0.5"
