"""analysis.estimates: means, standard errors and how they are written, on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from attnscale.analysis import estimates


def test_mean_and_se_of_the_mean():
    assert estimates.mean([1.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError, match="^mean of no values$"):
        estimates.mean([])
    m, se = estimates.mean_se([1.0, 2.0, 6.0])  # sample std sqrt(7), SE sqrt(7/3)
    assert m == 3.0 and math.isclose(se, math.sqrt(7 / 3))
    assert estimates.mean_se([4.0]) == (4.0, None)  # one value: no noise estimate
    assert estimates.mean_se([]) == (None, None)


def test_spread_and_binomial_se():
    # relative SE of the sample std of q·k: ½·sqrt((2 + 6/d)/n); at d = 4, n = 100: ½·sqrt(3.5/100)
    assert math.isclose(estimates.spread_se(4, 100), 0.5 * math.sqrt(0.035) * 2)
    assert math.isclose(estimates.binomial_se(0.7, 12_800), math.sqrt(0.21 / 12_800))
    assert estimates.binomial_se(0.0, 100) > 0  # a 0% share still has a width
    assert estimates.within(22.0, 21.0, 0.05) and not estimates.within(22.2, 21.0, 0.05)


def test_plus_minus_writes_a_mean_and_its_se():
    assert estimates.plus_minus(1.23456, 0.01234) == "1.235 ± 0.012"
    assert estimates.plus_minus(1.23456, 0.01234, terminal=True) == "1.235 ±0.012"
    assert estimates.plus_minus(2.0, None) == "2.000" and estimates.plus_minus(2.0, None, terminal=True) == "2.000"
    assert estimates.plus_minus(None, 0.1) == "—" and estimates.plus_minus(None, None, terminal=True) == "-"
    assert estimates.plus_minus(7.25, 0.5, "{:.1f}") == "7.2 ± 0.5"


def test_plus_minus_never_prints_a_zero_se():
    # an SE the format would round to 0 is shown to two significant digits, the mean to the same place
    assert estimates.plus_minus(382.2, 0.3, "{:,.0f}") == "382.20 ± 0.30"
    assert estimates.plus_minus(0.958, 0.0004, "{:.1%}") == "95.800% ± 0.040%"
    assert estimates.plus_minus(3.2, 0.004, "{:.2f}", terminal=True) == "3.2000 ±0.0040"
    assert estimates.plus_minus(1234.5, 12.0, "{:,.0f}") == "1,234 ± 12"  # enough digits already: unchanged
    assert estimates.plus_minus(3.2, 0.0, "{:.2f}") == "3.20 (seeds identical)"
    # a signed mean (a gap) keeps its sign; its SE carries none
    assert estimates.plus_minus(-0.5, 0.7, "{:+.2f}") == "-0.50 ± 0.70"
    assert estimates.plus_minus(3.0, 0.004, "{:+.2f}", terminal=True) == "+3.0000 ±0.0040"


def test_plus_minus_says_when_seeds_agree_exactly_in_both_forms():
    assert estimates.plus_minus(3.2, 0.0, "{:.2f}", terminal=True) == "3.20 (identical)"
    assert estimates.plus_minus(3.2, 0.0, "{:.2f}", terminal=False) == "3.20 (seeds identical)"


def test_a_percent_se_just_under_a_power_of_ten_keeps_two_significant_digits():
    # SE 0.0000992 is 0.00992 percentage points: two significant digits are 0.0099, 4 decimals
    # (were it 0.0100 or more, 3 decimals would do); "{:.1%}" alone would print it as 0.0%
    assert estimates.plus_minus(0.5, 0.0000992, "{:.1%}") == "50.0000% ± 0.0099%"
    # 0.000101 is 0.0101 points: 0.010, 3 decimals
    assert estimates.plus_minus(0.5, 0.000101, "{:.1%}") == "50.000% ± 0.010%"


def test_within_includes_its_edge():
    assert estimates.within(3.0, 2.0, 0.5) and estimates.within(1.0, 2.0, 0.5)  # |1| <= 0.5 · 2 exactly
    assert not estimates.within(3.25, 2.0, 0.5)
