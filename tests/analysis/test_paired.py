"""analysis.paired against hand calculations and printed t tables (t(0.975, 2) = 4.302653, t(0.95, 2) = 2.919986,
t(0.975, 3) = 3.182446), never against the module's own numbers."""

import math

import pytest

from attnscale.analysis import act_judging, paired


def test_mcnemar_exact_by_hand():
    # 6 discordant pairs one way, none the other: 2 * (1/2)^6 = 0.03125
    assert paired.mcnemar_exact(6, 0) == pytest.approx(0.03125)
    # 5 and 1: 2 * (C(6,0) + C(6,1)) / 64 = 14 / 64
    assert paired.mcnemar_exact(5, 1) == pytest.approx(14 / 64)
    assert paired.mcnemar_exact(0, 0) == 1.0
    assert paired.mcnemar_exact(3, 3) == 1.0
    with pytest.raises(ValueError):
        paired.mcnemar_exact(-1, 2)


def test_act_judging_uses_the_shared_test():
    assert act_judging.mcnemar_exact is paired.mcnemar_exact


def test_paired_t_three_seeds():
    a = {0: 1.1, 1: 1.2, 2: 1.3}
    b = {0: 1.0, 1: 1.0, 2: 1.0}  # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1
    t = paired.paired_t(a, b)
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert t["n"] == 3 and t["diff"] == pytest.approx(0.2)
    assert t["interval"][0] == pytest.approx(0.2 - half, abs=1e-6)
    assert t["interval"][1] == pytest.approx(0.2 + half, abs=1e-6)
    assert t["reading"] == "inconclusive"  # the interval holds 0


def test_paired_t_reads_lower_and_leaves_out_non_finite():
    a = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: None}
    b = {0: 1.5, 1: 1.6, 2: 1.55, 3: 1.45, 4: 2.0}
    t = paired.paired_t(a, b)
    assert t["n"] == 4 and t["left_out"] == 1
    assert t["reading"] == "lower"
    diffs = [-0.5, -0.6, -0.55, -0.45]
    sd = math.sqrt(sum((d + 0.525) ** 2 for d in diffs) / 3)
    assert t["interval"][1] == pytest.approx(-0.525 + 3.182446 * sd / 2, abs=1e-6)


def test_paired_t_same_difference_everywhere_reads_its_sign():
    t = paired.paired_t({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0})
    assert t["se"] == 0 and t["reading"] == "higher"


def test_equivalence_inside_the_margin():
    # differences 0.001, 0.002, 0.003: 90% interval 0.002 ± 2.919986 · 0.001/√3 = [0.000314, 0.003686]
    e = paired.equivalence({0: 1.001, 1: 1.002, 2: 1.003}, {0: 1.0, 1: 1.0, 2: 1.0}, margin=0.02)
    assert e["verdict"] == "equivalent"
    assert e["interval_90"][0] == pytest.approx(0.002 - 2.919986 * 0.001 / math.sqrt(3), abs=1e-6)


def test_equivalence_different_and_inconclusive():
    far = paired.equivalence({0: 1.10, 1: 1.11, 2: 1.12}, {0: 1.0, 1: 1.0, 2: 1.0}, margin=0.02)
    assert far["verdict"] == "different"
    wide = paired.equivalence({0: 1.0, 1: 1.05, 2: 0.96}, {0: 1.0, 1: 1.0, 2: 1.0}, margin=0.02)
    assert wide["verdict"] == "inconclusive"
    one = paired.equivalence({0: 1.0}, {0: 1.0}, margin=0.02)
    assert one["verdict"] == "inconclusive"


@pytest.mark.parametrize("margin", [0, -0.1, float("nan"), None, "0.02", True])
def test_equivalence_refuses_a_bad_margin(margin):
    with pytest.raises(ValueError, match="margin"):
        paired.equivalence({0: 1.0}, {0: 1.0}, margin=margin)


def test_by_seed_averages_cells_and_marks_a_non_finite_seed():
    rows = [{"seed": 0, "v": 1.0}, {"seed": 0, "v": 2.0}, {"seed": 1, "v": 4.0}, {"seed": 1, "v": None}]
    assert paired.by_seed(rows, lambda r: r["v"]) == {0: 1.5, 1: None}


def test_share_wilson_by_hand():
    s = paired.share(0, 15)
    assert s["share"] == 0 and s["interval"][0] == 0.0
    assert s["interval"][1] == pytest.approx(0.204, abs=5e-4)  # 0 of 15: [0, 0.204]
    # 10 of 20, z = 1.959964: centre 0.5, half = z·sqrt(0.25/20 + z²/1600) / (1 + z²/20)
    z = 1.959964
    half = z * math.sqrt(0.25 / 20 + z * z / 1600) / (1 + z * z / 20)
    lo, hi = paired.share(10, 20)["interval"]
    assert lo == pytest.approx(0.5 - half, abs=1e-6) and hi == pytest.approx(0.5 + half, abs=1e-6)
    for bad in [(3, 2), (-1, 4), (1.5, 4), (True, "4")]:
        with pytest.raises(ValueError):
            paired.share(*bad)


def test_estimate_text_never_prints_zero_width():
    assert paired.estimate_text(None, None, 0, None) == "—"
    assert paired.estimate_text(0.1234, None, 1, None, signed=True) == "+0.123 (n=1, no interval)"
    assert paired.estimate_text(0.5, 0.0, 3, (0.5, 0.5), alike="every seed alike") == "0.500 (every seed alike)"
    # SE 0.0123 sets 3 decimals (two significant digits of the SE)
    assert paired.estimate_text(-0.2, 0.0123, 3, (-0.253, -0.147), signed=True) == "-0.200 [-0.253, -0.147]"
    assert paired.estimate_text(1.6, 0.0004, 3, (1.5983, 1.6017)) == "1.60000 [1.59830, 1.60170]"
