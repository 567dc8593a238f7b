"""analysis/warning on hand-made runs in the published series format: the landmark, leads and survival
from it, breakers against holders with Welch's interval, alarms in held runs, the dating rules, and the
published study's figures read again; every expected number worked out by hand in the comments."""

import json
import math
from pathlib import Path

import pytest

from attnscale.analysis import detectors as det
from attnscale.analysis import warning as wr

ROOT = Path(__file__).resolve().parents[2]


def run(rid, learned, broke, scores, steps=3000, seed=0, cell="z0", arm="A", every=100, columns=False, **more):
    """A run whose outcome is given and whose max |score| at each probe (every ``every`` steps) is ``scores(step)``."""
    steps_ = list(range(0, steps, every))
    probes = [{"step": t, "max_score": scores(t), **{k: f(t) for k, f in more.items()}} for t in steps_]
    if columns:
        probes = {k: [p[k] for p in probes] for k in probes[0]}
    return {"run_id": rid, "cell": cell, "arm": arm, "seed": seed, "steps": steps, "losses": [2.0] * steps,
            "probes": probes, "outcome": {"learned_at": learned, "break_step": broke}}


def high(t):
    return 5000.0


def low(t):
    return 10.0


def late(t):
    return 5000.0 if t >= 1100 else 10.0


def at_break(t):
    return 5000.0 if t == 1200 else 10.0


RUNS = [run("b1", 600, 1500, high, seed=1),  # over 1e3 all along: fired at the landmark (800), lead 700
        run("b2", 600, 1300, late, seed=2),  # under at 800, crosses at 1100: a fresh crossing, lead 200
        run("b3", 600, 1200, at_break, seed=3),  # over only at its break's own step: no warning
        run("b4", 800, 900, high, seed=4),  # landmark 1000, after its break: not read
        run("h1", 600, None, high, seed=5),  # held, on at its landmark, alarms
        run("h2", 600, None, low, seed=6),  # held, silent
        run("n1", None, None, high, seed=7)]  # never learned


def test_the_landmark_is_200_steps_after_learning_and_never_inside_warm_up_or_its_slope_window():
    assert wr.landmark(RUNS[0]) == 800  # 600 + 200
    assert wr.landmark(run("x", 300, None, low)) == 700  # 500 + 200 would put the slope window in the warm-up
    assert wr.landmark(run("x", 600, 800, low)) is None  # broke at the landmark itself
    assert wr.landmark(run("x", 600, 801, low)) == 800
    assert wr.landmark(run("x", 600, None, low, steps=800)) is None  # ended first
    assert wr.landmark(RUNS[-1]) is None


def test_leads_count_from_the_landmark_beside_the_survival_from_it():
    got = wr.landmark_leads(RUNS, 1e3)
    assert (got["breakers"], got["holders"]) == (3, 2)  # b4 broke before its landmark, n1 never learnt
    on = got["on_at_landmark"]
    assert (on["breakers"]["k"], on["breakers"]["n"], on["holders"]["k"], on["holders"]["n"]) == (1, 3, 1, 2)
    assert (got["hits"]["k"], got["hits"]["n"], got["fresh_crossings"]) == (2, 3, 1)
    assert got["hits"]["ci"] == det.wilson(2, 3)
    assert (got["holders_alarmed"]["k"], got["holders_alarmed"]["n"]) == (1, 2)
    # leads 1500 − 800 and 1300 − 1100; survivals 700, 500 and 400
    assert (got["lead"]["n"], got["lead"]["median"]) == (2, 450)
    assert (got["survival"]["n"], got["survival"]["median"]) == (3, 500)
    lo, hi = got["survival"]["ci"]
    assert 400 <= lo <= 500 <= hi <= 700
    # a value that is not finite fires; at 1e4 nothing does
    nan = run("b5", 600, 1500, lambda t: math.nan if t == 900 else 10.0)
    assert wr.landmark_leads([nan], 1e3)["lead"]["median"] == 600
    assert wr.landmark_leads(RUNS, 1e4)["hits"]["k"] == 0


def test_probes_read_the_same_in_rows_or_in_columns():
    rows, cols = run("c", 600, 1300, late), run("c", 600, 1300, late, columns=True)
    assert wr.probes(rows) == wr.probes(cols)
    assert wr.landmark_leads([cols], 1e3)["lead"]["median"] == 200


def test_welch_by_hand():
    # a = (1, 3), b = (0, 2): means 2 and 1, each variance 2, so SE² = 2/2 + 2/2 and df = 2² / (1 + 1) = 2;
    # t(0.975, 2) = 0.95 √2 / √(1 − 0.95²) (Student's t at two degrees of freedom, in closed form)
    got = wr.welch([1.0, 3.0], [0.0, 2.0])
    t = 0.95 * math.sqrt(2) / math.sqrt(1 - 0.95 ** 2)
    assert got["diff"] == 1.0 and got["df"] == pytest.approx(2.0)
    assert got["ci"] == (pytest.approx(1 - t * math.sqrt(2)), pytest.approx(1 + t * math.sqrt(2)))
    # unequal sizes: a = (1, 2, 3), b = (0, 2): SE² = 1/3 + 1, df = (4/3)² / ((1/3)²/2 + 1) = 32/19
    assert wr.welch([1.0, 2.0, 3.0], [0.0, 2.0])["df"] == pytest.approx(32 / 19)
    assert wr.welch([1.0], [0.0, 2.0])["ci"] is None and wr.welch([1.0], [0.0, 2.0])["diff"] == 0.0
    assert wr.welch([1.0, 1.0], [0.0, 0.0])["ci"] is None  # no spread either side
    assert wr.welch([], [1.0])["diff"] is None


def test_the_level_and_slope_read_log10_of_a_scale_and_the_loss_as_its_window_mean():
    r = run("s", 600, None, lambda t: 10.0 ** (t / 100), every=10)
    assert wr.level_at(r, "max_score", 805) == pytest.approx(8.0)  # the probe at 800
    assert wr.slope_at(r, "max_score", 800) == pytest.approx(1.0)  # one decade per 100 steps
    assert wr.slope_at(r, "max_score", 800, window=15) is None  # two probes in [785, 800]: too few
    r["losses"] = [2.0 + t / 1000 for t in range(3000)]
    # the 20-step mean at 800 is 2 + 790.5 / 1000; it rises 0.1 per 100 steps
    assert wr.level_at(r, "loss", 800) == pytest.approx(2.7905)
    assert wr.slope_at(r, "loss", 800) == pytest.approx(0.1)
    neg = run("n", 600, None, low, log_z=lambda t: -1.0)
    assert wr.level_at(neg, "log_z", 800) == -1.0  # read as it is: no log of a log Z


def test_breakers_against_holders_at_the_landmark():
    # two breakers at 1e3.5 and 1e4.5 at their landmarks, two holders at 1e1 and 1e2: levels 4 − 1.5 = 2.5
    runs = [run("b", 600, 2000, lambda t, v=v: v, seed=s) for s, v in enumerate((10 ** 3.5, 10 ** 4.5))]
    runs += [run("h", 600, None, lambda t, v=v: v, seed=s + 2) for s, v in enumerate((10.0, 100.0))]
    got = wr.compare_at_landmark(runs, keys=("max_score",))["max_score"]
    # each side's variance 0.5, so SE² = 0.25 + 0.25 and df = 0.5² / (0.25² + 0.25²) = 2: 2.5 ± t(0.975, 2) √0.5
    t = 0.95 * math.sqrt(2) / math.sqrt(1 - 0.95 ** 2)
    assert got["level"]["diff"] == pytest.approx(2.5) and got["level"]["n"] == [2, 2]
    assert got["level"]["ci"] == (pytest.approx(2.5 - t * math.sqrt(0.5)), pytest.approx(2.5 + t * math.sqrt(0.5)))
    assert got["level"]["separates"] is False  # −0.54 to 5.54
    assert got["slope"]["diff"] == pytest.approx(0.0) and got["slope"]["ci"] is None  # flat: no spread
    assert wr.separation_text({"max_score": got}) == ("Nothing separates breakers from holders at the landmark: every "
                                                      "interval (levels and slopes, 1 in all) holds 0.")
    apart = {"max_score": {"level": {"ci": (0.5, 1.0), "separates": True}, "slope": {"ci": (-1, 1), "separates": False}}}
    assert wr.separation_text(apart).startswith("largest max |score|'s level separates breakers from holders")
    assert "(1 of 2 intervals leave out 0; about 0.1 would by chance)" in wr.separation_text(apart)
    assert wr.separation_text({"max_score": {"level": {"ci": None, "separates": False}}}).startswith("Too few")


def test_the_alarm_share_of_held_runs_with_its_at_risk_steps_and_the_curve():
    got = wr.alarm_share(RUNS, 1e3)
    assert (got["k"], got["n"], got["at_risk_steps"]) == (1, 2, 2400 + 2400)  # h1 and h2, from 600 to 3000
    assert got["ci"] == det.wilson(1, 2)
    pts = {c["level"]: c for c in wr.curve(RUNS, (1e3, 1e4))}
    # from the step each learnt: b1 (at 600), b2 (1100), b4 (800) fire before their breaks; b3 only at its own
    assert (pts[1e3]["hits"]["k"], pts[1e3]["hits"]["n"]) == (3, 4)
    assert pts[1e4]["hits"]["k"] == 0 and pts[1e4]["held_alarmed"]["k"] == 0
    # a run that learnt inside the warm-up is counted from its end: an alarm at 400 is not read, one at 500 is
    early = [run("e", 300, None, lambda t: 5000.0 if t == 400 else 10.0),
             run("f", 300, None, lambda t: 5000.0 if t == 500 else 10.0)]
    got = wr.alarm_share(early, 1e3)
    assert (got["k"], got["n"], got["at_risk_steps"]) == (1, 2, 2500 + 2500)
    assert wr.alarm_share(early, 1e3, warmup=0)["k"] == 2
    assert wr.curve([run("g", 300, 1000, lambda t: 5000.0 if t == 400 else 10.0)], (1e3,))[0]["hits"]["k"] == 0


LEARNT = [3.0] * 20 + [1.0] * 60  # learns at step 30 (level 2); the 20-step mean is 1.0 from step 39 to 79


def test_each_dating_rule_by_hand():
    # from step 80: one loss of 1.125 (within 0.2 of the minimum 1.0, not 0.1), then 1.5. The mean at 80 + n
    # (n <= 19) is (19 − n + 1.125 + 1.5 n) / 20, under 1.5 until the window is all 1.5 at step 100 (the
    # crossing); it is within 0.1 of 1.0 while 20.125 + 0.5 n <= 22, i.e. up to n = 3 (step 83)
    losses = LEARNT + [1.125] + [1.5] * 69
    assert wr.dates(losses, 2.0) == {"study": 80, "smoothed": 84, "crossing": 100, "raw_0.2": 81}
    blown = LEARNT + [None]
    assert wr.dates(blown, 2.0) == {name: 80 for name in wr.DATINGS}
    assert wr.dates(LEARNT + [1.0] * 100, 2.0) is None
    runs = [{"run_id": "a", "losses": losses}, {"run_id": "b", "losses": blown}, {"run_id": "c", "losses": LEARNT}]
    got = wr.dating_sensitivity(runs, 2.0)
    assert got["breaks"] == 2 and got["runs"]["a"]["crossing"] == 100
    assert got["rules"]["smoothed"] == {"moved": 1, "median_shift": 2, "largest_shift": 4}
    assert got["rules"]["crossing"] == {"moved": 1, "median_shift": 10, "largest_shift": 20}
    assert got["rules"]["raw_0.2"] == {"moved": 1, "median_shift": 0.5, "largest_shift": 1}


def _published():
    """A study's JSON in brief: one qk-norm-off cell at the chosen rung 0.1, one qk-norm cell, two seeds a half."""
    outcomes = [{"arm": "qk-off", "lr": 0.1, "seed": 0, "kind": "mid-run break", "learned_at": 601, "broke": 1200,
                 "degraded": True},  # survival 1200 − 610
                {"arm": "qk-off", "lr": 0.1, "seed": 1, "kind": "mid-run break", "learned_at": 700, "broke": 1000,
                 "degraded": True},  # survival 300
                {"arm": "qk-off", "lr": 0.1, "seed": 2, "kind": "learned, held", "learned_at": 500, "broke": None,
                 "degraded": True},  # 1,000 steps at risk
                {"arm": "qk-off", "lr": 0.1, "seed": 3, "kind": "learned, held", "learned_at": 1000, "broke": None,
                 "degraded": False},  # 500
                {"arm": "qk-on", "lr": 0.1, "seed": 0, "kind": "learned, held", "learned_at": 100, "broke": None,
                 "degraded": False}]  # 1,400
    detectors = {"max_score>1000": {"lead": {"median": 445.0}, "false_alarms": {"false_alarms": 2, "per_1000": 4 / 3},
                                    "predicts_degraded": {}}}
    versus = {"loss_spike": {"max_score>1000": {"p": 0.5}}}
    same = {"auc": 0.8, "ci": [0.6, 0.9]}
    on = {"max_score>100": {"predicts_degraded": {"0.1": same, "0.25": {"auc": 0.5, "ci": [0.2, 0.8]}}},
          "max_score": {"predicts_degraded": {"0.1": same, "0.25": {"auc": 0.5, "ci": None}}},
          "words": {"predicts_degraded": {"0.1": {"auc": 0.3, "ci": [0.1, 0.5]}, "0.25": {"auc": 0.2, "ci": [0.0, 0.45]}}}}
    return {"pilot": {"chosen": [0.1]}, "max_false_alarms_per_1000": 0.05, "outcomes": outcomes,
            "cells": [{"arm": "qk-off", "lr": 0.1, "detectors": detectors, "versus": versus},
                      {"arm": "qk-off", "lr": 0.3, "detectors": {}, "versus": {}},
                      {"arm": "qk-on", "lr": 0.1, "detectors": on}],
            "folds": {"max_score": [{"choosing_seeds": [0, 2], "threshold": 1e5}, {"choosing_seeds": [1, 3], "threshold": None}],
                      "words": [{"choosing_seeds": [0, 2], "threshold": None}, {"choosing_seeds": [1, 3], "threshold": None}]}}


def test_the_published_leads_read_as_survival_and_its_false_alarm_rate_as_one_over_the_mean_at_risk():
    (got,) = wr.old_leads(_published(), probe_every=10, steps=1500)
    assert (got["breaks"], got["held"], got["held_degraded"]) == (2, 2, 1)
    assert got["survival_median"] == (590 + 300) / 2 and got["lead_median"] == 445.0
    assert got["per_mean_at_risk"] == pytest.approx(1000 * 2 / (1000 + 500))  # = the 4/3 reported: both alarmed
    assert got["two_to_one_minus_n"] == 0.5 and got["sign_p"] == 0.5  # two broken seeds
    assert got["break_steps"] == [1000, 1200]
    assert got["learned_median"] == {"breakers": 650.5, "holders": 750}


def test_a_detector_silenced_in_both_folds_is_said_to_be_silenced_with_its_budget():
    got = wr.silenced(_published(), steps=1500)
    assert list(got) == ["words"]  # max_score chose 1e5 in one fold: not silenced
    # held runs of seeds 0, 2: seed 2 (1,000 steps) and the qk-norm seed 0 (1,400); of seeds 1, 3: seed 3 (500)
    assert got["words"]["at_risk_steps"] == [2400, 500]
    assert got["words"]["alarms_allowed"] == [0, 0]  # 0.05 × 2.4 = 0.12: not one alarm
    assert "silenced by its rule" in got["words"]["why"] and "0 in 2,400 steps" in got["words"]["why"]


def test_the_auc_count_keeps_distinct_readings_apart_and_says_where_warm_up_holds_them():
    got = wr.auc_readings(_published(), steps=1500, warmup=500)
    assert got["intervals"] == 6  # the qk-norm cell only: 3 detectors × 2 shares
    # leaving out 0.5: max_score>100 and max_score at 10% (one reading twice) and words at 25%
    assert (got["excluding_half"], got["distinct_excluding_half"]) == (3, 2)
    assert got["distinct_intervals"] == 5  # the two max-score readings at 10% coincide
    assert got["shares"] == {"0.1": {"step": 150, "inside_warmup": True}, "0.25": {"step": 375, "inside_warmup": True}}
    assert wr.auc_readings(_published(), steps=4000, warmup=500)["shares"]["0.25"]["inside_warmup"] is False


def test_the_published_study_read_again_from_its_json():
    """The figures docs/warn-study.md states, from docs/warn-study.json (checked by hand against its outcomes)."""
    r = json.loads((ROOT / "docs" / "warn-study.json").read_text())["recipe"]
    leads = {(c["arm"], c["lr"]): c for c in wr.old_leads(r, 10, 1500)}
    assert [(leads[k]["lead_median"], leads[k]["survival_median"]) for k in sorted(leads)] == [
        (596, 596), (435, 435), (568.5, 572), (320.5, 320.5)]
    assert all(c["per_1000"] == pytest.approx(c["per_mean_at_risk"]) for c in leads.values() if c["held"])
    assert all(c["false_alarms"] == c["held"] == c["held_degraded"] for c in leads.values())
    assert all(c["sign_p"] == c["two_to_one_minus_n"] for c in leads.values())
    assert sorted(wr.silenced(r, 1500)) == ["entropy_collapse", "grad_norm_spike", "qk_rms_growth"]
    auc = wr.auc_readings(r, 1500, 500)
    assert (auc["intervals"], auc["excluding_half"], auc["distinct_excluding_half"]) == (72, 7, 4)


def test_the_hazard_rows_run_from_the_landmark_in_100_step_intervals_to_the_break_or_the_end():
    breaker = run("b", 600, 1050, lambda t: 1000.0 if t >= 900 else 10.0)  # landmark 800
    holder = run("h", 600, None, low, steps=1100)
    # intervals from 800: [800, 900) reads the probe at 800 (10), [900, 1000) and [1000, 1100) the 1000 at 900
    # and 1000; the break at 1050 falls in the last. The holder: 800, 900 and 1000, all at 10, no event. Beside
    # each reading, the interval's count from the landmark
    assert wr.hazard_rows([breaker, holder]) == [((1.0, 0.0), 0), ((3.0, 1.0), 0), ((3.0, 2.0), 1),
                                                 ((1.0, 0.0), 0), ((1.0, 1.0), 0), ((1.0, 2.0), 0)]
    assert wr.hazard_rows([run("n", None, None, high)]) == []


def test_the_logistic_hazard_is_the_log_odds_ratio_for_a_covariate_of_two_values():
    # x = 0: 2 events in 10 intervals; x = 1: 5 in 10. With two values of x the fit is the 2 × 2 table's:
    # b = log((5/5) / (2/8)) = log 4, its Wald SE √(1/5 + 1/5 + 1/2 + 1/8)
    rows = [((0.0,), 1)] * 2 + [((0.0,), 0)] * 8 + [((1.0,), 1)] * 5 + [((1.0,), 0)] * 5
    got = wr.logistic(rows)
    se = math.sqrt(1 / 5 + 1 / 5 + 1 / 2 + 1 / 8)
    assert (got["intervals"], got["events"]) == (20, 7)
    assert got["b"] == pytest.approx(math.log(4)) and got["se"][1] == pytest.approx(se)
    assert got["ci"] == (pytest.approx(math.log(4) - 1.959964 * se), pytest.approx(math.log(4) + 1.959964 * se))
    assert got["odds_ratio"] == pytest.approx(4.0)
    # no estimate: no event, every interval an event, one value of x, or the events separated by x
    assert wr.logistic([((0.0,), 0), ((1.0,), 0)])["b"] is None
    assert wr.logistic([((0.0,), 1), ((1.0,), 1)])["b"] is None
    assert wr.logistic([((1.0,), 0), ((1.0,), 1)])["b"] is None
    assert wr.logistic([((0.0,), 0)] * 5 + [((1.0,), 1)] * 5)["b"] is None
    assert wr.logistic([((0.0, 1.0), 0), ((1.0, 1.0), 1), ((2.0, 1.0), 0)])["b"] is None  # time does not vary


def test_the_hazard_with_time_beside_the_score_is_the_likelihoods_maximum_with_its_curvature_for_errors():
    # no closed form with two covariates: the fit must zero the score equations Σ (y − p) x = 0, and its SEs must
    # be the square roots of the inverse of the log-likelihood's curvature, here taken by finite differences
    rows = [((x, t), y) for x, t, y in [(1, 0, 0), (1, 1, 0), (2, 2, 1), (1, 0, 0), (2, 1, 0), (3, 2, 1), (2, 3, 0),
                                        (1, 0, 1), (3, 1, 0), (2, 0, 0), (3, 3, 1), (1, 2, 0), (2, 1, 1), (1, 3, 0)]]
    got = wr.logistic(rows)
    beta = got["coefficients"]

    def loglik(c):
        total = 0.0
        for (x, t), y in rows:
            eta = c[0] + c[1] * x + c[2] * t
            total += y * eta - math.log1p(math.exp(eta))
        return total

    def p(c, x, t):
        return 1 / (1 + math.exp(-(c[0] + c[1] * x + c[2] * t)))

    for j in range(3):
        assert math.fsum((y - p(beta, x, t)) * (1.0, x, t)[j] for (x, t), y in rows) == pytest.approx(0, abs=1e-9)
    h = 1e-4
    curv = [[0.0] * 3 for _ in range(3)]
    for i in range(3):
        for j in range(3):
            def at(di, dj):
                c = list(beta)
                c[i] += di
                c[j] += dj
                return loglik(c)
            curv[i][j] = -(at(h, h) - at(h, -h) - at(-h, h) + at(-h, -h)) / (4 * h * h)
    # the inverse of a 3 × 3 by cofactors: the variance of the score's coefficient is its (1, 1) cofactor / det
    m = curv
    det3 = (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    var_b = (m[0][0] * m[2][2] - m[0][2] * m[2][0]) / det3
    assert got["se"][1] == pytest.approx(math.sqrt(var_b), rel=1e-4)
    assert got["b"] == beta[1] and got["odds_ratio"] == pytest.approx(math.exp(beta[1]))
