"""The course's judges one by one, on hand-made runs: the boundaries of each rule, and each
verdict's words, checked to the letter against values worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from test_report import _train

from attnscale.report import course, load_runs


class Run:
    """A dynamics run as the claims read it: layer means by step ("first"/"last") and measure."""

    def __init__(self, scale, first, last, head_dim=1024, status="done", steps=(0, 1200)):
        self.head_dim, self.scale, self.status = head_dim, scale, status
        self._means = {"first": first, "last": last}
        self._steps = dict(zip(("first", "last"), steps))

    def line(self, which):
        return {"step": self._steps[which]}  # an unknown ``which`` is a KeyError, as a wrong name must be

    def layer_means(self, which, key):
        return list(self._means[which][key])

    def diag_mean(self, which, key):
        values = self._means[which][key]
        return sum(values) / len(values)


def runs(dynamics=(), spread_rows=(), fresh_rows=None):
    return SimpleNamespace(dynamics=list(dynamics), sweep=[], spread_rows=list(spread_rows), fresh_rows=fresh_rows or {})


# ---- spread at one width -------------------------------------------------------------


def test_a_raw_spread_exactly_three_se_from_root_d_agrees_and_a_little_further_differs():
    # SE 0.25 and 8 ± 0.75 are exact in binary: the boundary is the rule's own (≤ 3 SE)
    at = runs(spread_rows=[{"head_dim": 64, "raw_spread": 8.75, "raw_spread_se": 0.25, "pairs": 20000}])
    assert course._raw_at(64, at) == ("8.750 ± 0.250", course.AGREES, "", "20,000 pairs")
    beyond = runs(spread_rows=[{"head_dim": 64, "raw_spread": 8.875, "raw_spread_se": 0.25, "pairs": 500}])
    assert course._raw_at(64, beyond) == ("8.875 ± 0.250", course.DIFFERS, "", "500 pairs")
    assert course._raw_at(256, at) == ("—", course.NOT_RUN, "", "no spread row at width 256")


# ---- the fresh head --------------------------------------------------------------------


def test_a_fresh_claim_shows_the_model_init_beside_and_says_when_rows_are_not_the_courses_64_words():
    def fmt(r):
        return f"{r['x']} words"

    rows = {("unit", 256, "none"): {"x": 1, "words": 64}, ("model", 256, "none"): {"x": 2}}
    assert course._fresh_claim(256, "none", fmt, lambda r: True, runs(fresh_rows=rows)) == (
        "1 words", course.AGREES, "model init: 2 words", "")
    assert course._fresh_claim(256, "none", fmt, lambda r: False, runs(fresh_rows=rows), note="n.") == (
        "1 words", course.DIFFERS, "model init: 2 words", "n.")
    alone = {("unit", 256, "none"): {"x": 1, "words": 65}}
    assert course._fresh_claim(256, "none", fmt, lambda r: True, runs(fresh_rows=alone), note="n.") == (
        "1 words", course.AGREES, "model init: not run", "n. Our rows are over 65 words, the course's over 64.")
    unsaid = {("unit", 256, "none"): {"x": 1}}  # a row that does not say its words is taken as the course's
    assert course._fresh_claim(256, "none", fmt, lambda r: True, runs(fresh_rows=unsaid))[3] == ""
    other_scale = {("unit", 256, "inv_sqrt_d"): {"x": 1}, ("model", 1024, "none"): {"x": 3}}
    assert course._fresh_claim(256, "none", fmt, lambda r: True, runs(fresh_rows=other_scale)) == (
        "—", course.NOT_RUN, "model init: not run", "no fresh row (init unit, d=256, scale none)")


# ---- training dynamics -----------------------------------------------------------------


def _spread(first, last):
    return {"spread": first}, {"spread": last}


def test_a_value_exactly_at_the_figure_reaches_it():
    first, last = _spread([21.0, 27.0], [5000.0, 6000.0])
    got = course._dyn_claim("none", "last", "spread", "{:,.0f}", runs([Run("none", first, last)]), above=5000.0, grows=True)
    assert got == ("5,000 in layer 0 at step 1200 (n=1, no interval; mean over all 2 layers: 5,500)",
                   course.AGREES, "", "")


def test_no_rise_at_all_is_not_a_rise_and_the_note_says_from_where():
    # one seed, last = first: the rise is exactly 0, which is not up
    first, last = _spread([100.0, 120.0], [100.0, 90.0])
    got = course._dyn_claim("none", "last", "spread", "{:.1f}", runs([Run("none", first, last, status="stopped")]),
                            above=5000.0, grows=True)
    assert got[1] == course.DIFFERS and got[2] == ""
    assert got[3] == "status: stopped; not up from 100.0 at the start"


def test_a_rise_whose_interval_reaches_below_zero_is_not_settled():
    # rises −1, +1, +3 over three seeds: mean 1, SE 2/sqrt(3), 95% t interval 1 ± 4.30 · 1.155, across 0
    dyn = [Run("none", {"spread": [20.0, 0.0]}, {"spread": [20.0 + r, 0.0]}) for r in (-1.0, 1.0, 3.0)]
    got = course._dyn_claim("none", "last", "spread", "{:.1f}", runs(dyn), above=5000.0, grows=True)
    assert got[1] == course.DIFFERS
    assert got[3] == "from 20.0 at the start; the rise is not beyond its noise"
    rising = [Run("none", {"spread": [20.0, 0.0]}, {"spread": [20.0 + r, 0.0]}) for r in (10.0, 11.0, 12.0)]
    got = course._dyn_claim("none", "last", "spread", "{:.1f}", runs(rising), above=5000.0, grows=True)
    assert (got[1], got[3]) == (course.PARTLY, "up from 20.0 at the start, but short of the course's figure")


def test_a_missing_scale_names_the_widths_that_did_run():
    other = Run("none", {"spread": [1.0]}, {"spread": [2.0]}, head_dim=64)
    got = course._dyn_claim("none", "last", "spread", "{:.1f}", runs([other]), above=5000.0)
    assert got == ("—", course.NOT_RUN, "", "no dynamics run at width 1024 with scale none (dynamics ran at d=64)")


# ---- the perplexity gap ---------------------------------------------------------------


def _gaps(root, by_width: dict[int, list[float]]):
    """Sweep records whose unscaled perplexity is the scaled 40 plus the given gap, one per seed."""
    for d, gaps in by_width.items():
        for seed, gap in enumerate(gaps):
            _train(root, "sweep", d, "inv_sqrt_d", seed, ppl=40.0, corpus="c")
            _train(root, "sweep", d, "none", seed, ppl=40.0 + gap, corpus="c")
    return {v.claim: v for v in course.evaluate(load_runs(root))}


D32 = "d=32: no difference (unscaled very slightly ahead)"
D128 = "d=128: the scale helps by about 2 points"
BIG = "d ≥ 256: worth 17 to 18 points"


def _ours(d, gap, share):
    return f"d={d}: {gap:+.2f} (1 seed, no noise estimate), {share} of the scaled ppl"


@pytest.mark.parametrize("gap, verdict, note", [
    (2.0, course.AGREES, ""),
    (0.5, course.PARTLY, "the direction holds (the scale helps), the size does not"),
    (0.0, course.DIFFERS, "the direction does not hold: the unscaled run is ahead or level"),  # 0 is not > 0
])
def test_the_scale_helps_claim_reads_its_sign_strictly_and_says_why(tmp_path, gap, verdict, note):
    v = _gaps(tmp_path, {128: [gap]})[D128]
    assert (v.ours, v.verdict, v.beside, v.note) == (_ours(128, gap, f"{gap / 40:.0%}"), verdict, "", note)


@pytest.mark.parametrize("gap, verdict, note", [
    (0.0, course.AGREES, ""),  # level is the course's "no difference": ≤ 0 holds at 0
    (0.5, course.DIFFERS, "the direction does not hold: the scaled run is ahead"),
    (-3.0, course.PARTLY, "the direction holds (the unscaled run is ahead or level), the size does not"),
])
def test_the_unscaled_ahead_claim_holds_at_level_and_names_the_scaled_run_when_not(tmp_path, gap, verdict, note):
    v = _gaps(tmp_path, {32: [gap]})[D32]
    assert (v.ours, v.verdict, v.note) == (_ours(32, gap, f"{gap / 40:.0%}"), verdict, note)


def test_seeds_that_cover_both_signs_leave_the_direction_open(tmp_path):
    # gaps −1 and +5: mean 2, SE 3, interval 2 ± 12.71 · 3 meets the band and both signs
    v = _gaps(tmp_path / "a", {128: [-1.0, 5.0]})[D128]
    assert v.verdict == course.INCONCLUSIVE
    assert v.note == "the interval covers both signs: whether the scale helps is not settled by these seeds"
    # gaps 40 and 40.5: interval 40.25 ± 12.71 · 0.25 lies above 0 and misses 1.5–2.5
    v = _gaps(tmp_path / "b", {128: [40.0, 40.5]})[D128]
    assert (v.verdict, v.note) == (course.PARTLY, "the direction holds (the scale helps), the size does not")


def test_the_size_failing_with_the_direction_unsettled_says_both(tmp_path):
    # gaps −0.3, +0.2, +0.4: mean 0.1, SE 0.208, interval 0.1 ± 4.303 · 0.208 = −0.80 to +1.00:
    # across 0 (direction open) and below 1.5 (the size fails)
    v = _gaps(tmp_path, {128: [-0.3, 0.2, 0.4]})[D128]
    assert v.verdict == course.DIFFERS
    assert v.note == "the size does not hold, and the direction is not settled"


def test_every_wide_width_is_listed_in_order(tmp_path):
    v = _gaps(tmp_path, {256: [17.0], 512: [18.0]})[BIG]
    assert v.ours == f"{_ours(256, 17.0, '42%')}; {_ours(512, 18.0, '45%')}"
    assert (v.verdict, v.beside, v.note) == (course.AGREES, "", "")


# ---- a claim judged, and the lines that say why ----------------------------------------


def test_a_claim_carries_its_words_tolerance_key_and_name_into_its_verdict():
    claim = course.Claim("sweep", "… by 2", "≈ 2", "within 1.5–2.5", lambda r: ("+2.00", course.AGREES, "b", "n"),
                         key="big_gap", name="d=128: the scale helps by 2")
    assert claim.evaluate(runs()) == course.Verdict("sweep", "… by 2", "≈ 2", "+2.00", "within 1.5–2.5", course.AGREES,
                                                    "b", "n", "big_gap", "d=128: the scale helps by 2")
    unnamed = course.Claim("spread", "√d", "8", "3 SE", lambda r: ("8.000", course.DIFFERS, "", ""))
    # a claim without a name of its own is named by its words
    assert unnamed.evaluate(runs()) == course.Verdict("spread", "√d", "8", "8.000", "3 SE", course.DIFFERS, "", "", "", "√d")


def test_reasons_give_one_line_per_claim_that_does_not_agree_with_its_note_only_where_there_is_one():
    got = [course.Verdict("sweep", "… by 2", "≈ 2", "+0.50", "tol A", course.PARTLY, note="the size does not", name="N"),
           course.Verdict("spread", "√d", "8", "9.000", "tol B", course.DIFFERS),
           course.Verdict("spread", "agreed", "8", "8.000", "tol C", course.AGREES, note="unsaid"),
           course.Verdict("sweep", "absent", "≈ 0", "—", "tol D", course.NOT_RUN, note="no sweep pair"),
           course.Verdict("sweep", "open", "> 0", "+1.00", "tol E", course.INCONCLUSIVE, note="both signs")]
    assert course.reasons(got) == ["N — partly (tolerance tol A): course ≈ 2, ours +0.50; the size does not",
                                   "√d — differs (tolerance tol B): course 8, ours 9.000",
                                   "open — inconclusive (tolerance tol E): course > 0, ours +1.00; both signs"]


def test_the_scoreboard_shows_inconclusive_and_not_run_only_where_some_claim_is():
    def v(verdict, claim):
        return course.Verdict("x", claim, "c", "o", "t", verdict)

    every = [v(course.AGREES, "a1"), v(course.DIFFERS, "d"), v(course.NOT_RUN, "n"), v(course.INCONCLUSIVE, "i"),
             v(course.PARTLY, "p"), v(course.AGREES, "a2")]
    head, lines = course.scoreboard(every)
    assert head == "2 agree, 1 partly, 1 inconclusive, 1 differ, 1 not run of 6 claims"
    assert lines == ["d: differs (course c, ours o)", "i: inconclusive (course c, ours o)", "p: partly (course c, ours o)"]
    assert course.scoreboard([v(course.AGREES, "a")], figures=False) == ("1 agree, 0 partly, 0 differ of 1 claims", [])


# ---- spread at the other widths, and divided by √d --------------------------------------------


def test_a_rows_se_is_its_records_else_the_footnotes_formula():
    assert course.spread_se({"head_dim": 16, "pairs": 1000, "raw_spread_se": 0.0}) == 0.0  # an SE of 0 is a record
    assert course.spread_se({"head_dim": 16, "pairs": 1000, "raw_spread_se": "0.5"}) == 0.5
    # ½ · sqrt((2 + 6/16) / 1000) · √16 = 2 · sqrt(0.002375) = 0.0974679
    got = course.spread_se({"head_dim": 16, "pairs": 1000, "raw_spread_se": None})
    assert got == pytest.approx(0.0974679, abs=1e-7)


def test_the_other_widths_are_listed_in_order_and_those_beyond_three_se_named():
    # SE 0.25 each (3 SE = 0.75, exact in binary): d=16 at 4.75 is exactly 3 SE from 4 (inside); d=36 at 7
    # and d=100 at 9 are 1 from 6 and 10 (outside); the course's widths (64 here) are another claim's
    rows = [{"head_dim": w, "raw_spread": raw, "raw_spread_se": 0.25, "pairs": 100}
            for w, raw in ((100, 9.0), (16, 4.75), (64, 100.0), (36, 7.0))]
    assert course._raw_elsewhere(runs(spread_rows=rows)) == (
        "d=16: 4.75 (√d=4.00); d=36: 7.00 (√d=6.00); d=100: 9.00 (√d=10.00)", course.DIFFERS, "",
        "outside: d=36, d=100")
    inside = [{"head_dim": 16, "raw_spread": 3.25, "raw_spread_se": 0.25, "pairs": 100}]  # 3 SE below 4
    assert course._raw_elsewhere(runs(spread_rows=inside)) == ("d=16: 3.25 (√d=4.00)", course.AGREES, "", "")
    beyond = [{"head_dim": 16, "raw_spread": 3.125, "raw_spread_se": 0.25, "pairs": 100}]  # 3.5 SE below
    assert course._raw_elsewhere(runs(spread_rows=beyond))[1:] == (course.DIFFERS, "", "outside: d=16")
    only_course = [{"head_dim": w, "raw_spread": w ** 0.5, "raw_spread_se": 0.25, "pairs": 100} for w in (4, 64, 256, 1024)]
    assert course._raw_elsewhere(runs(spread_rows=only_course)) == ("—", course.NOT_RUN, "", "no other widths measured")


def test_the_scaled_spread_is_judged_by_the_raw_se_times_the_factor_at_each_width():
    # d=64: SE 0.5 · 0.125 = 0.0625, 3 SE = 0.1875, and 0.5 is 0.5 from 1 (outside);
    # d=16: SE 0.5 · 0.25 = 0.125, 3 SE = 0.375, and 1.375 is exactly that from 1 (inside)
    rows = [{"head_dim": 64, "scale": "inv_sqrt_d", "factor": 0.125, "scaled_spread": 0.5, "raw_spread_se": 0.5},
            {"head_dim": 16, "scale": "inv_sqrt_d", "factor": 0.25, "scaled_spread": 1.375, "raw_spread_se": 0.5},
            {"head_dim": 32, "scale": "none", "factor": 1.0, "scaled_spread": 9.0, "raw_spread_se": 0.5},
            {"head_dim": 8, "factor": 1.0, "scaled_spread": 9.0, "raw_spread_se": 0.5}]  # no scale: not a scaled row
    assert course._scaled_one(runs(spread_rows=rows)) == (
        "0.500 – 1.375 over 2 widths (SE ≈ 0.125)", course.DIFFERS, "", "outside: d=64")
    both_out = [{**rows[0]}, {**rows[1], "scaled_spread": 1.5}]  # 0.5 from 1 is 4 SE at d=16
    assert course._scaled_one(runs(spread_rows=both_out))[1:] == (course.DIFFERS, "", "outside: d=16, 64")
    assert course._scaled_one(runs(spread_rows=[rows[1]])) == ("1.375 – 1.375 over 1 widths (SE ≈ 0.125)",
                                                                course.AGREES, "", "")
    assert course._scaled_one(runs(spread_rows=rows[2:])) == ("—", course.NOT_RUN, "", "no spread rows with scale inv_sqrt_d")


# ---- the fresh head's rows -----------------------------------------------------------------


def test_the_one_word_figure_shows_the_rows_example_or_nothing():
    row = {"effective_words_median": 1.234, "max_weight_mean": 0.9876, "example": "row 3 on word 7"}
    assert course._one_word(row) == "median 1.23 effective words, mean max weight 0.988; e.g. row 3 on word 7"
    del row["example"]
    assert course._one_word(row) == "median 1.23 effective words, mean max weight 0.988; e.g. "


def test_rows_counted_are_sequences_times_words_each_defaulting_to_the_courses():
    assert course._rows_counted({"sequences": 3, "words": 100}) == 300
    assert course._rows_counted({"words": 100}) == 100  # no sequences: one
    assert course._rows_counted({"sequences": 3}) == 192  # no words: the course's 64, 3 · 64
    assert course._rows_counted({"sequences": None, "words": None}) == 64


def test_all_or_none_frozen_gives_the_rule_of_three_bound_over_the_rows_counted():
    # 64 rows (nothing said: one sequence of the course's 64 words): 300 / 64 = 4.6875, so "over 95.31%"
    assert course._frozen({"frozen_fraction": 1.0}) == "100% of 64 rows frozen (95% bound: over 95.31%)"
    assert course._frozen({"frozen_fraction": 0.0}) == "0% of 64 rows frozen (95% bound: under 4.7%)"
    # 100 rows: 300 / 100 = 3
    assert course._frozen({"frozen_fraction": 0.0, "words": 100}) == "0% of 100 rows frozen (95% bound: under 3%)"


def test_a_frozen_shares_se_is_in_points_to_its_first_digit():
    # 50% of 196 · 64 = 12,544 = 112² rows: SE 100 · 0.5 / 112 = 0.446 points, one decimal: 0.4
    assert course._frozen({"frozen_fraction": 0.5, "sequences": 196}) == "50.0% of 12,544 rows frozen (SE 0.4 pts)"
    # 50% of 15,625 · 64 = 1,000,000 rows: SE 100 · 0.5 / 1,000 = 0.05 points, two decimals
    assert course._frozen({"frozen_fraction": 0.5, "sequences": 15625}) == \
        "50.00% of 1,000,000 rows frozen (SE 0.05 pts)"


def _share_row(p, sequences, words):
    return {"frozen_fraction": p, "sequences": sequences, "words": words}


def test_seven_in_ten_holds_exactly_three_binomial_se_outside_the_rounding_interval_and_not_beyond():
    # 0.62 of 38 · 62 = 2,356 rows: SE sqrt(0.62 · 0.38 / 2,356) = sqrt(0.2356 / 2,356) = 0.01, and
    # 0.65 − 3 · 0.01 = 0.62: on the lower bound (exactly so in floating point, checked here)
    assert 0.65 - 3 * (0.62 * 0.38 / 2356) ** 0.5 == 0.62
    assert course._seven_in_ten(_share_row(0.62, 38, 62)) is True
    # 0.619: SE sqrt(0.619 · 0.381 / 2,356) = 0.010005, bound 0.619985 > 0.619; 4 SE would reach 0.60998
    assert course._seven_in_ten(_share_row(0.619, 38, 62)) is False
    # 0.78 of 26 · 66 = 1,716 rows: SE sqrt(0.78 · 0.22 / 1,716) = sqrt(0.1716 / 1,716) = 0.01, 0.75 + 0.03 = 0.78
    assert 0.75 + 3 * (0.78 * 0.22 / 1716) ** 0.5 == 0.78
    assert course._seven_in_ten(_share_row(0.78, 26, 66)) is True
    # 0.781: SE 0.0099836, bound 0.779951 < 0.781; 4 SE would reach 0.789934
    assert course._seven_in_ten(_share_row(0.781, 26, 66)) is False
    assert course._seven_in_ten(_share_row(0.70, 26, 66)) is True


# ---- estimates over seeds, in words -----------------------------------------------------


T1 = 12.7062047  # t(0.975) with 1 degree of freedom: tan(0.475 π)
T2 = 4.3026527  # with 2: t / sqrt(2 + t²) = 0.95, t² = 1.805 / 0.0975


def test_an_estimate_is_the_mean_its_se_and_its_t_interval_kept_inside_0_1_only_for_a_share():
    # 0.990 and 0.992: mean 0.991, SE |a − b| / 2 = 0.001, interval 0.991 ± 12.7062 · 0.001
    m, se, n, lo, hi = course._estimate([0.990, 0.992])
    assert (n, m, se, lo, hi) == (2, pytest.approx(0.991), pytest.approx(0.001), pytest.approx(0.991 - T1 * 0.001),
                                  pytest.approx(0.991 + T1 * 0.001))
    m, se, n, lo, hi = course._estimate([0.990, 0.992], share=True)
    assert (lo, hi) == (pytest.approx(0.991 - T1 * 0.001), 1.0)
    m, se, n, lo, hi = course._estimate([0.001, 0.003], share=True)  # 0.002 ± 0.0127: below 0 kept at 0
    assert (lo, hi) == (0.0, pytest.approx(0.002 + T1 * 0.001))
    assert course._estimate([4.0]) == (4.0, None, 1, 4.0, 4.0)  # one seed: no interval, the value itself


def test_an_estimate_in_words_has_its_figure_and_its_interval_apart():
    assert course.with_interval((4.06, 0.16, 2, 2.03, 6.09), "{:.2f}") == ("4.06 ± 0.16", "2 seeds, 95% interval 2.03 – 6.09")
    assert course.with_interval((4.06, None, 1, 4.06, 4.06), "{:.2f}") == ("4.06", "n=1, no interval")


def test_a_gap_in_words_shows_its_se_and_interval_and_widens_an_se_that_would_round_to_zero():
    # +2.10 ± 0.30 over 3 seeds: 2.10 ± 4.3027 · 0.30 = 0.809 to 3.391
    assert course.fmt_gap(2.1, 0.3, 3) == "+2.10 ± 0.30 (3 seeds, 95% interval +0.81 – +3.39)"
    # SE 0.0012 shows as "0.00" at two decimals, so four (its two first digits): 0.5 ± 12.7062 · 0.0012 = ±0.0152
    assert course.fmt_gap(0.5, 0.0012, 2) == "+0.5000 ± 0.0012 (2 seeds, 95% interval +0.48 – +0.52)"
    assert course.fmt_gap(0.44, None, 1) == "+0.44 (1 seed, no noise estimate)"


def test_a_band_is_the_figure_less_and_more_its_relative_tolerance():
    assert course._band(20.0, 0.25) == (15.0, 25.0)  # 20 · 0.75, 20 · 1.25, exact in binary


# ---- dynamics: the share's interval, the steps, the statuses ------------------------------------


def test_a_frozen_share_over_seeds_keeps_its_interval_inside_100_percent_and_lists_every_step():
    # layer 0 ends at 0.990 and 0.992 (steps 1000 and 1200): 99.1% ± 0.1%, interval 97.8% to 100.4%, kept at
    # 100.0%; layer 1 at 0.590 and 0.592, so the mean over layers is (0.79 + 0.792) / 2 = 79.1%
    dyn = [Run("none", {"frozen_fraction": [0.5, 0.5]}, {"frozen_fraction": [0.990, 0.590]}, steps=(0, 1000)),
           Run("none", {"frozen_fraction": [0.5, 0.5]}, {"frozen_fraction": [0.992, 0.592]}, steps=(0, 1200))]
    got = course._dyn_claim("none", "last", "frozen_fraction", "{:.1%}", runs(dyn), above=0.99)
    # 97.8% to 100.0% reaches both sides of 99%: inconclusive
    assert got == ("99.1% ± 0.1% in layer 0 at step 1000, 1200 (2 seeds, 95% interval 97.8% – 100.0%; "
                   "mean over all 2 layers: 79.1%)", course.INCONCLUSIVE, "", "")


def test_a_spread_over_seeds_is_not_kept_inside_0_1():
    # spreads 0.990 and 0.992 are no share: the interval's upper end 0.991 + 0.0127 = 1.004 stands
    dyn = [Run("none", {"spread": [0.990]}, {"spread": [0.990]}), Run("none", {"spread": [0.992]}, {"spread": [0.992]})]
    got = course._dyn_claim("none", "first", "spread", "{:.4f}", runs(dyn), band=(1.001, 2.0))
    assert got[1] == course.AGREES and "interval 0.9783 – 1.0037" in got[0]


def test_the_status_note_names_every_status_once_in_order_where_any_run_is_not_done():
    dyn = [Run("none", {"spread": [21.0]}, {"spread": [21.0]}, status=s) for s in ("stopped", "done", "diverged", "stopped")]
    got = course._dyn_claim("none", "first", "spread", "{:.1f}", runs(dyn), band=(18.9, 23.1))
    assert got[1:] == (course.AGREES, "", "status: diverged, done, stopped")


class _NoLines(Run):
    def line(self, which):
        return None  # a run that recorded no metrics line


def test_dynamics_are_read_only_at_1024_with_the_scale_and_a_first_line():
    # the widths that ran are named, each once, in order; a run at 1024 without a first line is none
    dyn = [Run("none", {"spread": [1.0]}, {"spread": [2.0]}, head_dim=256),
           Run("inv_sqrt_d", {"spread": [21.0]}, {"spread": [21.0]}),
           Run("none", {"spread": [1.0]}, {"spread": [2.0]}, head_dim=64),
           _NoLines("none", {"spread": [21.0]}, {"spread": [21.0]})]
    assert course._dyn_claim("none", "first", "spread", "{:.1f}", runs(dyn), band=(18.9, 23.1)) == (
        "—", course.NOT_RUN, "", "no dynamics run at width 1024 with scale none (dynamics ran at d=64, 256, 1024)")
    assert course._dyn_claim("none", "first", "spread", "{:.1f}", runs(), band=(18.9, 23.1)) == (
        "—", course.NOT_RUN, "", "no dynamics run at width 1024 with scale none")


# ---- frozen heads do not recover ------------------------------------------------------


def _frozen_runs(pairs):
    """One run per (layer 0 at the start, at the end); layer 1 frozen throughout, which no claim reads."""
    return runs([Run("none", {"frozen_fraction": [a, 1.0]}, {"frozen_fraction": [b, 1.0]}) for a, b in pairs])


def test_frozen_heads_level_from_start_to_end_do_not_recover():
    assert course._not_recovering(_frozen_runs([(0.5, 0.5)])) == (
        "50.0% → 50.0% frozen in layer 0 (change +0.0 pts; n=1, no interval)", course.AGREES, "", "")


def test_frozen_heads_that_fall_with_one_seed_recover_however_little():
    assert course._not_recovering(_frozen_runs([(0.5, 0.4)])) == (
        "50.0% → 40.0% frozen in layer 0 (change -10.0 pts; n=1, no interval)", course.DIFFERS, "", "")


def test_a_rise_in_frozen_share_whose_interval_reaches_below_zero_is_not_settled():
    # rises 0.10 and 0.12: +11.0 ± 1.0 points, interval 11 ± 12.7062 · 1 = −1.7 to +23.7 points
    assert course._not_recovering(_frozen_runs([(0.60, 0.70), (0.62, 0.74)])) == (
        "61.0% → 72.0% frozen in layer 0 (change +11.0 ± 1.0 pts; 2 seeds, 95% interval -1.7 – +23.7)",
        course.INCONCLUSIVE, "", "")
    # rises 0.10 and 0.1002: interval 10.01 ± 12.7062 · 0.01 points, all above 0
    assert course._not_recovering(_frozen_runs([(0.60, 0.70), (0.60, 0.7002)]))[1] == course.AGREES


def test_a_change_in_frozen_share_is_shown_in_points_with_its_se_and_interval_to_the_letter():
    # rises 0.24552 and 0.25448: +25.0 points, SE 100 · 0.00896 / 2 = 0.448 (one decimal: 0.4), interval
    # 25 ± 12.7062 · 0.448 = 25 ± 5.692: +19.3 to +30.7 points, above 0
    assert course._not_recovering(_frozen_runs([(0.5, 0.74552), (0.5, 0.75448)])) == (
        "50.0% → 75.0% frozen in layer 0 (change +25.0 ± 0.4 pts; 2 seeds, 95% interval +19.3 – +30.7)",
        course.AGREES, "", "")
    # rises 0.2498 and 0.2502: SE 0.02 points would show as 0.0, so three decimals (its two first digits);
    # interval 25 ± 12.7062 · 0.02 = +24.7 to +25.3
    assert course._not_recovering(_frozen_runs([(0.5, 0.7498), (0.5, 0.7502)]))[0] == (
        "50.0% → 75.0% frozen in layer 0 (change +25.000 ± 0.020 pts; 2 seeds, 95% interval +24.7 – +25.3)")


def test_frozen_heads_not_run_without_unscaled_dynamics_at_1024():
    other = runs([Run("inv_sqrt_d", {"frozen_fraction": [0.0]}, {"frozen_fraction": [0.0]})])
    assert course._not_recovering(other) == ("—", course.NOT_RUN, "", "no dynamics run at width 1024 without the scale")


# ---- where the gap starts ---------------------------------------------------------------


def _sweep_runs(root, by_width: dict[int, list[float]]):
    for d, gaps in by_width.items():
        for seed, gap in enumerate(gaps):
            _train(root, "sweep", d, "inv_sqrt_d", seed, ppl=40.0, corpus="c")
            _train(root, "sweep", d, "none", seed, ppl=40.0 + gap, corpus="c")
    return load_runs(root)


RULE = ("the rule attnscale sweep uses: gap > 1 ppl (and, with 2 or more seeds, its 95% t interval above 0) "
        "at this width and every wider one")


def test_the_start_is_given_both_ways_where_a_gap_is_not_yet_beyond_its_noise(tmp_path):
    # d=128: gaps 0 and 4, 2 ± 12.7 · 2 reaches below 0 (undecided); d=256: 17 and 18, 17.5 ± 12.7 · 0.5 above 0
    r = _sweep_runs(tmp_path, {128: [0.0, 4.0], 256: [17.0, 18.0]})
    assert (course.gap_start(r), course.gap_start(r, undecided_counts=True)) == (256, 128)
    assert course._starts(r) == ("from d=256 (from d=128 if the gaps not yet beyond their noise are real)",
                                 course.INCONCLUSIVE, "", RULE)


@pytest.mark.parametrize("by_width, ours, verdict", [
    ({32: [0.5], 128: [2.0]}, "from d=128", course.AGREES),  # 128 is "by 128"
    ({32: [2.0], 64: [2.0]}, "from d=32", course.DIFFERS),  # 32 is not "after 32"
    ({128: [0.5], 256: [2.0]}, "from d=256", course.DIFFERS),
    ({64: [0.5], 128: [1.0]}, "no gap beyond its noise up to d=128", course.DIFFERS),  # a gap of 1 is not > 1
    ({32: [0.5], 33: [2.0]}, "from d=33", course.AGREES),  # any width is a sweep's to choose: 33 is after 32
    ({64: [0.5], 129: [2.0]}, "from d=129", course.DIFFERS),  # and 129 is past 128
])
def test_the_start_agrees_only_after_32_and_by_128(tmp_path, by_width, ours, verdict):
    assert course._starts(_sweep_runs(tmp_path, by_width)) == (ours, verdict, "", RULE)


def test_the_start_needs_two_widths(tmp_path):
    assert course._starts(_sweep_runs(tmp_path, {128: [2.0]})) == (
        "—", course.NOT_RUN, "", "fewer than two widths with both schemes in the sweep")
