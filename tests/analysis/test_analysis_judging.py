"""The verdict rule on an interval, with hand-computed intervals (``analysis.judging``)."""

from attnscale.analysis import intervals
from attnscale.analysis import judging as j


def helps(lo, hi, band=(1.5, 2.5)):
    """"The scale helps by about 2 points": size 1.5–2.5, direction gap > 0."""
    return j.verdict(j.overlaps(lo, hi, band), j.side(lo, hi, lambda x: x > 0))


def test_the_issue_cases():
    # −0.5 ± 0.7 from 2 seeds: 95% interval −0.5 ± 12.706·0.7 = −9.39 … 8.39: covers both signs
    lo, hi = intervals.interval(-0.5, 0.7, 2)
    assert round(lo, 2) == -9.39 and round(hi, 2) == 8.39
    assert helps(lo, hi) == j.INCONCLUSIVE
    # one seed at −0.5: no interval, the wrong sign differs however small
    assert helps(-0.5, -0.5) == j.DIFFERS and helps(-0.01, -0.01) == j.DIFFERS
    # d=32, "≈ 0, unscaled ahead or level" at +0.44 ± 0.23 (fp32) and +0.33 ± 0.10 (bf16), 2 seeds each:
    # both intervals (−2.48 … 3.36 and −0.94 … 1.60) cover both signs, so both runs say the same thing
    for m, se in ((0.44, 0.23), (0.33, 0.10)):
        lo, hi = intervals.interval(m, se, 2)
        assert lo < 0 < hi
        assert j.verdict(j.overlaps(lo, hi, (-1.0, 0.0)), j.side(lo, hi, lambda x: x <= 0)) == j.INCONCLUSIVE


def test_each_verdict_from_an_interval():
    assert helps(1.8, 2.4) == j.AGREES
    assert helps(0.2, 3.9) == j.AGREES  # consistent with "about 2" and the sign established
    assert helps(3.0, 4.0) == j.PARTLY  # the scale helps, by more than 2.5
    assert helps(-3.0, -1.0) == j.DIFFERS  # the unscaled run ahead
    assert helps(-1.0, 1.0) == j.DIFFERS  # below the band and not even the sign settled
    assert helps(-1.0, 1.6) == j.INCONCLUSIVE


def test_one_sided_sizes_and_growth():
    over = lambda lo, hi: j.side(lo, hi, lambda v: v >= 5000)  # noqa: E731
    assert j.verdict(over(5100, 9000), j.HOLDS) == j.AGREES
    assert j.verdict(over(300, 330), j.HOLDS) == j.PARTLY  # grew, short of 5,000
    assert j.verdict(over(300, 330), j.UNDECIDED) == j.DIFFERS
    assert j.verdict(over(300, 330), j.FAILS) == j.DIFFERS
    assert j.verdict(over(3000, 7000), j.HOLDS) == j.INCONCLUSIVE


def test_worst_of_several_head_dims():
    assert j.worst([j.AGREES, j.PARTLY]) == j.PARTLY
    assert j.worst([j.PARTLY, j.INCONCLUSIVE]) == j.INCONCLUSIVE
    assert j.worst([j.INCONCLUSIVE, j.DIFFERS, j.AGREES]) == j.DIFFERS
    assert j.worst([j.AGREES]) == j.AGREES
