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
