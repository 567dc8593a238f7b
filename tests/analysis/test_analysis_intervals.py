"""analysis.intervals: t quantiles, paired differences and Holm's correction, against printed tables and hand calculations."""

import math

import pytest

from attnscale.analysis import intervals as iv

# Student's t, two-sided 95% and 99% (upper 0.975 and 0.995 quantiles), as printed in Fisher & Yates' tables
TABLE = {1: (12.706, 63.657), 2: (4.303, 9.925), 3: (3.182, 5.841), 4: (2.776, 4.604), 9: (2.262, 3.250),
         30: (2.042, 2.750), 120: (1.980, 2.617)}


@pytest.mark.parametrize("df", sorted(TABLE))
def test_t_quantile_matches_the_printed_table(df):
    q975, q995 = TABLE[df]
    assert iv.t_quantile(0.975, df) == pytest.approx(q975, abs=6e-4)
    assert iv.t_quantile(0.995, df) == pytest.approx(q995, abs=6e-4)
    assert iv.t_quantile(0.025, df) == pytest.approx(-q975, abs=6e-4)


def test_t_cdf_closed_forms():
    # df = 1 is the Cauchy: F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0, 40.0):
        assert iv.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert iv.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # many degrees of freedom: the normal's 1.959964
    assert iv.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"p must lie strictly between 0 and 1, got 1\.0"):
        iv.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom must be positive, got 0"):
        iv.t_cdf(1.0, 0)


def test_interval_uses_the_degrees_of_freedom_at_hand():
    # two seeds: 1 degree of freedom, so mean ± 12.706 SE, not ± 2 SE
    lo, hi = iv.interval(0.44, 0.23, 2)
    assert (lo, hi) == pytest.approx((0.44 - 12.7062 * 0.23, 0.44 + 12.7062 * 0.23), abs=1e-3)
    assert iv.interval(1.0, None, 1) is None
    assert iv.interval(1.0, 0.5, 1) is None


def test_paired_difference_against_a_hand_calculation():
    # per-seed differences 1.0, 2.0, 4.0: mean 7/3, sd sqrt(7/3), SE sqrt(7/9), t = 7/3 / sqrt(7/9) = sqrt(7)
    a = {0: 11.0, 1: 12.0, 2: 14.0, 9: 99.0}
    b = {0: 10.0, 1: 10.0, 2: 10.0}
    got = iv.paired(a, b)
    assert got["n"] == 3 and got["diff"] == pytest.approx(7 / 3)
    assert got["se"] == pytest.approx(math.sqrt(7 / 9))
    assert got["t"] == pytest.approx(math.sqrt(7))
    # two-sided p with 2 df: 1 − t / sqrt(2 + t²) = 1 − sqrt(7/9)
    assert got["p"] == pytest.approx(1 - math.sqrt(7 / 9), abs=1e-12)
    lo, hi = got["interval"]
    assert hi - 7 / 3 == pytest.approx(4.302653 * math.sqrt(7 / 9), abs=1e-5)
    assert iv.paired({0: 1.0}, {0: 0.5})["p"] is None


def test_holm_against_a_worked_example():
    # p = .01 .04 .03 .005, m = 4: sorted .005·4 = .02, .01·3 = .03, .03·2 = .06, .04·1 = .04 → running max .06
    assert iv.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert iv.holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert iv.holm([]) == []


def test_paired_holm_adjusts_over_every_pair_and_reads_the_sign():
    # pair 0: differences 1, 2, 4 (p = 1 − sqrt(7/9) ≈ 0.118, as above); pair 1: differences −1.0, −1.1, −1.05
    # (mean −1.05, SD 0.05, SE 0.05/sqrt 3, t = −21 sqrt 3, p from the closed form at 2 df)
    pairs = [({0: 11.0, 1: 12.0, 2: 14.0}, {0: 10.0, 1: 10.0, 2: 10.0}),
             ({0: 9.0, 1: 8.9, 2: 8.95}, {0: 10.0, 1: 10.0, 2: 10.0}),
             ({0: 1.0}, {0: 0.5})]  # one seed: no test
    got = iv.paired_holm(pairs)
    p0 = 1 - math.sqrt(7 / 9)
    t1 = 21 * math.sqrt(3)
    p1 = 1 - t1 / math.sqrt(2 + t1 * t1)
    assert [g["p"] for g in got[:2]] == pytest.approx([p0, p1], rel=1e-9) and got[2]["p"] is None
    # Holm over the two tests: the smaller p times 2, the larger times 1, running max
    assert got[1]["p_holm"] == pytest.approx(2 * p1, rel=1e-9) and got[0]["p_holm"] == pytest.approx(max(p0, 2 * p1))
    assert got[2]["p_holm"] is None
    assert [iv.reading(g) for g in got] == ["inconclusive", "lower", "inconclusive"]
    assert iv.reading({"diff": 0.3, "p_holm": 0.049}) == "higher" and iv.reading({"diff": 0.3, "p_holm": 0.05}) == "inconclusive"


def test_p_text_never_prints_zero():
    assert iv.p_text(0.0004) == "< 0.001" and iv.p_text(0.001) == "0.001" and iv.p_text(0.9812) == "0.981"
    assert iv.p_text(None) == ""


def test_precision_follows_the_standard_error():
    assert iv.decimals_for(0.23) == 2 and iv.decimals_for(0.004) == 4 and iv.decimals_for(31.0) == 0
    text = iv.with_error(95.8, 0.004, 2)
    assert "± 0.0040" in text and "0.00 " not in text.replace("0.0040", "")
    assert iv.with_error(382.0, 0.0, 2) == "382.00 (2 seeds, identical)"
    assert iv.with_error(4.06, None, 1) == "4.06 (n=1, no interval)"
    # the printed interval is the t interval: 4.06 ± 12.706 · 0.16
    assert iv.with_error(4.06, 0.16, 2) == "4.06 ± 0.16 (2 seeds, 95% interval 2.03 – 6.09)"
