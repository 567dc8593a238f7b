"""The recipe study's judging (``analysis.recipe_judging``) on hand-made runs whose every number is worked
out here: outcomes from the loss alone, alarms counted only while a learned run is at risk, hits strictly
before the break, false alarms per 1,000 at-risk steps, thresholds cross-fitted (each run judged by a
threshold chosen on the other half of the seeds), readings oriented so that larger is worse, and the
rule that decides the watch's defaults."""

import math
import random

import pytest

from attnscale.analysis import detectors as det
from attnscale.analysis import recipe_judging as rs

LEVEL, FLOOR = 1.75, 2.5
LEARNT = [3.0] * 20 + [1.0] * 60  # learned at step 32: the first 20-step mean under 1.75 (13 ones)
BROKE = LEARNT + [1.5] * 69  # rises 0.5 above its minimum at step 80 and holds: a break at 80
HELD = LEARNT + [1.0] * 69  # 149 steps, at risk from 32: 117 steps


def series(losses, scores, final=1.0):
    """Probes every 10 steps with one head's max |score| from ``scores`` (step -> value, else 5)."""
    probes = tuple((t, {"max_score": [scores.get(t, 5.0)], "effective_words": [2.0]}) for t in range(0, len(losses), 10))
    return det.Series(tuple(losses), probes, final)


def row(seed, losses, scores, final=1.0, lr=0.1, arm="qk-off-z0"):
    return {"arm": arm, "lr": lr, "seed": seed, "steps": len(losses), "series": series(losses, scores, final)}


CELL = [row(0, BROKE, {60: 500.0, 70: 500.0}, final=1.6),  # warned 20 steps before its break
        row(1, HELD, {}),  # silent
        row(2, BROKE, {}, final=1.6),  # missed
        row(3, HELD, {100: 500.0})]  # one false alarm
MAX100 = next(d for d in rs.STUDY_DETECTORS if d.name == "max_score>100")


def test_a_learned_run_is_at_risk_from_where_it_learnt_to_its_break_and_a_hit_comes_strictly_before():
    o = rs.outcome_of(CELL[0], LEVEL, FLOOR, best_of_arm=1.0)
    assert (o.learned_at, o.broke.step, o.degraded) == (32, 80, True)  # 1.6 > best 1.0 + 0.1
    w = rs.watched(CELL[0], o, MAX100, 100)
    assert (w.start, w.end, w.broke, w.alarm, w.hit, w.lead) == (32, 80, 80, 60, True, 20)
    held = rs.watched(CELL[3], rs.outcome_of(CELL[3], LEVEL, FLOOR, 1.0), MAX100, 100)
    assert (held.start, held.end, held.broke, held.alarm, held.false_alarm) == (32, 149, None, 100, True)
    # an alarm before the run learnt is not counted: the run was not at risk yet
    early = row(5, HELD, {10: 500.0})
    assert rs.watched(early, rs.outcome_of(early, LEVEL, FLOOR, 1.0), MAX100, 100).alarm is None
    # a run that never learnt is not judged at all
    flat = row(6, [3.0] * 149, {10: 500.0}, final=3.0)
    assert rs.watched(flat, rs.outcome_of(flat, LEVEL, FLOOR, 1.0), MAX100, 100) is None
    # the loss's own spike lands on the break's own step: no time to act, so no hit
    spike = next(d for d in rs.STUDY_DETECTORS if d.name == "loss_spike")
    w = rs.watched(CELL[0], o, spike, 6)
    assert (w.alarm, w.hit) == (80, False)


def test_a_cell_is_judged_with_counts_rates_and_thresholds_chosen_on_the_other_half_of_the_seeds():
    got = rs.judge(CELL, LEVEL, FLOOR)
    assert got["halves"] == {"first": [0, 2], "second": [1, 3]}
    cell = got["cells"][0]
    assert {k: cell[k] for k in ("seeds", "runs", "learned", "mid_run_breaks", "never_learned")} == {
        "seeds": 4, "runs": 4, "learned": 4, "mid_run_breaks": 2, "never_learned": 0}
    assert cell["mid_run_breaks_by_half"] == {"first": 2, "second": 0}
    fixed = cell["detectors"]["max_score>100"]
    assert (fixed["hits"]["hits"], fixed["hits"]["breaks"]) == (1, 2)
    assert fixed["false_alarms"]["false_alarms"] == 1 and fixed["false_alarms"]["at_risk_steps"] == 117 + 117
    assert fixed["false_alarms"]["per_1000"] == pytest.approx(1000 / 234)
    assert fixed["lead"]["median"] == 20
    # chosen: seeds 0 and 2 hold no run that held, so no threshold has a false-alarm rate there: none
    # qualifies and seeds 1, 3 are judged silent; on seeds 1 and 3, 10–300 false-alarm (1 in 234 steps)
    # and 1e3 is the first that does not: seeds 0 and 2 are judged at 1e3, which misses the 500
    assert [f["threshold"] for f in got["folds"]["max_score"]] == [None, 1e3]
    chosen = cell["detectors"]["max_score"]
    assert (chosen["hits"]["hits"], chosen["false_alarms"]["false_alarms"]) == (0, 0)
    # paired against the loss's spike (which hits neither): leads 20 − 0 and 0 − 0
    v = cell["versus"]["loss_spike"]["max_score>100"]
    assert (v["runs"], v["median"], v["p"]) == (2, 10, 1.0)  # one non-zero seed: a sign test's p is 1
    assert v["verdict"] == "inconclusive" and not v["holds"]


def test_two_folds_that_choose_different_thresholds_judge_each_half_by_the_others():
    # seeds 0, 2 choose: seed 0 breaks with a score of 50 at step 60, seed 2 holds with 20 at step 100, so 10
    # false-alarms and 30 is the one with a hit and none; seeds 1, 3: a break with 500 at 60, a holder with 200 at
    # 100, so 10–100 false-alarm and 300 is chosen. Judged crosswise: seed 0 at 300 misses its 50, seed 2 at
    # 300 is silent, seed 1 at 30 is warned at 60 (20 steps before its break at 80), seed 3 at 30 false-alarms.
    cell = [row(0, BROKE, {60: 50.0}, final=1.6), row(1, BROKE, {60: 500.0}, final=1.6),
            row(2, HELD, {100: 20.0}), row(3, HELD, {100: 200.0})]
    got = rs.judge(cell, LEVEL, FLOOR)
    assert [(f["judged_seeds"], f["threshold"]) for f in got["folds"]["max_score"]] == [([1, 3], 30), ([0, 2], 300)]
    chosen = got["cells"][0]["detectors"]["max_score"]
    assert (chosen["hits"]["hits"], chosen["hits"]["breaks"], chosen["lead"]["median"]) == (1, 2, 20)
    assert (chosen["false_alarms"]["false_alarms"], chosen["false_alarms"]["at_risk_steps"]) == (1, 117 + 117)


def test_an_even_number_of_hits_has_the_mean_of_the_middle_two_leads_as_its_median():
    # four seeds, four breaks at step 80 warned at 70, 60, 50 and 40 by max |score| > 100: leads 10, 20, 30, 40
    cell = [row(s, BROKE, {80 - 10 * (s + 1): 500.0}, final=1.6) for s in range(4)]
    got = rs.judge(cell, LEVEL, FLOOR)
    assert got["halves"] == {"first": [0, 2], "second": [1, 3]}
    assert got["cells"][0]["mid_run_breaks_by_half"] == {"first": 2, "second": 2}
    lead = got["cells"][0]["detectors"]["max_score>100"]["lead"]
    assert (lead["hits"], lead["median"]) == (4, 25)
    assert rs.lead_text(lead).startswith("25 [")


def test_readings_are_oriented_so_that_larger_means_worse():
    r = row(0, HELD, {20: 40.0, 30: 80.0})
    by = {d.name: d for d in rs.STUDY_DETECTORS}
    assert rs.reading(r, by["max_score"], 0.25) == 80.0  # the last probe within 37 steps: step 30
    assert rs.reading(r, by["max_score"], 0.10) == 5.0  # within 14 steps: step 10
    assert rs.reading(r, by["loss_spike"], 0.25) == pytest.approx((3.0 * 2 + 1.0 * 18) / 20)  # steps 18–37
    s = det.Series((1.0,) * 100, tuple((t, {"effective_words": [2.0 - t / 100], "qk_rms": [1.0 + t / 10, 0.5],
                                             "log_z": [4.0 - t / 10]}) for t in range(0, 100, 10)))
    r = {"arm": "a", "lr": 0.1, "seed": 0, "steps": 100, "series": s}
    assert rs.reading(r, by["entropy_collapse"], 0.25) == pytest.approx(0.2)  # 2.0 − 1.8
    assert rs.reading(r, by["qk_rms_growth"], 0.25) == pytest.approx(3.0 / 1.0)  # max(3.0, 0.5) / first max
    assert rs.reading(r, by["log_z_drift"], 0.25) == pytest.approx(2.0)  # |2.0 − 4.0|
    blown = row(0, HELD[:30] + [math.nan] + HELD[31:], {})
    assert rs.reading(blown, by["loss_spike"], 0.25) == math.inf


def test_a_degraded_end_predicted_early_is_scored_by_auc_within_the_cell():
    # two degraded runs whose max score was already high at 10% of the steps, two that were not
    cell = [row(s, HELD, {10: v}, final=f) for s, (v, f) in enumerate([(900.0, 2.9), (800.0, 2.8),
                                                                         (5.0, 1.0), (6.0, 1.0)])]
    got = rs.judge(cell, LEVEL, FLOOR)["cells"][0]["detectors"]["max_score"]["predicts_degraded"]
    assert got["0.1"]["auc"] == 1.0  # every (degraded, not) pair ordered rightly


def test_the_defaults_rule_needs_every_breaking_cell_to_hit_half_under_the_false_alarm_budget():
    got = rs.judge(CELL, LEVEL, FLOOR)
    v = rs.verdict(got, rungs=[0.1])
    assert v["cells"] == [("qk-off-z0", 0.1)] and v["defaults"] == []
    why = v["detectors"]["max_score>100"]["why_not"]
    assert any("4.27 false alarms per 1,000 steps" in w for w in why)
    assert any("earlier than the loss's spike detector (Holm) in 0 of 1 cells" in w for w in why)
    assert "hit rate 0% under 50%" in " ".join(v["detectors"]["max_score"]["why_not"])
    assert rs.verdict(got, rungs=[0.3])["detectors"]["max_score"]["why_not"] == [
        "no qk-norm-off cell of the chosen rungs has a mid-run break"]


def test_the_loss_and_grad_norm_spike_baselines_fire_where_a_brute_force_robust_z_does():
    import random
    import statistics

    rng = random.Random(3)
    losses = [2.0 - 0.001 * t + rng.gauss(0, 0.02) for t in range(200)]
    losses[120] += 0.15  # a jump of about 5 SDs
    losses[150] = math.nan  # a blow-up
    grads = [(t, 1.0 + rng.gauss(0, 0.05) + (0.6 if t == 100 else 0.0)) for t in range(0, 200, 10)]
    s = det.Series(tuple(losses), tuple((t, {"grad_norm": [g]}) for t, g in grads))
    by = {d.name: d for d in rs.STUDY_DETECTORS}

    def brute(points, window, sigmas, start):
        history = []
        for t, v in points:
            if not math.isfinite(v):
                if t >= start:
                    return t
                continue
            if len(history) >= 5:
                h = history[-window:]
                med = statistics.median(h)
                sd = max(1.4826 * statistics.median([abs(x - med) for x in h]), 1e-3)
                if t >= start and (v - med) / sd > sigmas:
                    return t
            history.append(v)
        return None

    for sigmas in (3, 4, 6, 10, 15):
        for start in (0, 60, 125):
            d = by["loss_spike"]
            assert d.alarm(d.read(s), sigmas, start) == brute(list(enumerate(losses)), 50, sigmas, start)
            d = by["grad_norm_spike"]
            assert d.alarm(d.read(s), sigmas, start) == brute(grads, 20, sigmas, start)
    assert by["loss_spike"].alarm(by["loss_spike"].read(s), 15, 125) == 150  # the NaN fires whatever the threshold
    assert by["grad_norm_spike"].alarm(by["grad_norm_spike"].read(s), 6, 0) == 100


def test_the_spike_baselines_are_not_silent_on_the_jump():
    # the brute-force comparison above means something only if the jump is seen at a low threshold
    losses = [2.0 + 0.01 * (t % 3) for t in range(120)] + [2.5] + [2.0] * 20
    s = det.Series(tuple(losses), ())
    d = next(d for d in rs.STUDY_DETECTORS if d.name == "loss_spike")
    assert d.alarm(d.read(s), 6, 0) == 120  # z = (2.5 − 2.01) / (1.4826 × 0.01) = 33
    assert d.alarm(d.read(s), 40, 0) is None


# ---- one detector judged within a cell --------------------------------------------------------------------


WATCHED = [rs.Watched(0, 100, 300, 300, 250),  # hit, lead 50
           rs.Watched(1, 100, 400, 400, 400),  # an alarm at the break itself: no warning
           rs.Watched(2, 100, 500, 500, None),  # missed
           rs.Watched(3, 100, 1000, None, None),  # held, silent: 900 steps at risk
           rs.Watched(4, 200, 1000, None, 600)]  # held, a false alarm: 800 steps at risk


def test_the_hit_rate_counts_only_alarms_before_the_break():
    got = rs.hit_rate(WATCHED)
    assert (got["hits"], got["breaks"], got["rate"]) == (1, 3, pytest.approx(1 / 3))
    # Wilson, 1 of 3, z = 1.959964: centre (1/3 + z²/6)/(1 + z²/3) = 0.42692, half-width 0.36543
    assert got["ci"] == (pytest.approx(0.06149, abs=1e-4), pytest.approx(0.79234, abs=1e-4))
    assert [w.lead for w in WATCHED] == [50, None, None, None, None]


def test_false_alarms_per_thousand_at_risk_steps_of_the_runs_that_held():
    got = rs.false_alarms_per_1000(WATCHED)
    assert (got["false_alarms"], got["at_risk_steps"]) == (1, 1700)
    assert got["per_1000"] == pytest.approx(1000 / 1700)
    # a third of the resamples hold no seed 4 (0.8⁵ = 0.33): rate 0; none can exceed seed 4 alone, 1000/800
    assert got["ci"][0] == 0 and got["ci"][1] <= 1.25


def test_no_false_alarm_gives_the_exact_poisson_upper_bound_not_a_point_at_zero():
    quiet = [rs.Watched(s, 0, 500, None, None) for s in range(4)]  # 2,000 steps held, no alarm
    got = rs.false_alarms_per_1000(quiet)
    assert (got["false_alarms"], got["per_1000"]) == (0, 0.0)
    # P(0 events | mean m) = e^-m = 0.025 at m = 3.689: per 1,000 steps of 2,000, 1.844
    assert got["ci"] == (0.0, pytest.approx(1000 * 3.6888794541139363 / 2000))


def test_the_sign_test_by_hand():
    assert rs.sign_test([1, 2, 3, -1, 0]) == pytest.approx(2 * (1 + 4) / 16)  # 3 up, 1 down, a zero dropped
    assert rs.sign_test([1] * 6) == pytest.approx(2 / 64)
    assert rs.sign_test([0, 0]) is None and rs.sign_test([]) is None


def test_the_paired_lead_counts_a_miss_as_no_lead():
    def runs(alarms):
        return [rs.Watched(s, 0, 200, 200 if s < 3 else None, a) for s, a in enumerate(alarms)]

    a, b = runs([150, 170, None, 50]), runs([180, None, 190, None])  # leads a 50, 30, 0; b 20, 0, 10
    got = rs.paired_lead(a, b)
    assert (got["runs"], got["median"]) == (3, 30)  # differences 30, 30, −10
    assert got["p"] == pytest.approx(2 * (1 + 3) / 8) and got["verdict"] == "inconclusive"
    # a resample of three seeds holds seed 2 twice or more 7 times in 27: the lower end is −10
    assert got["ci"][0] == -10
    ahead = rs.paired_lead(runs([150, 170, 160, None]), runs([None, None, None, None]))
    assert ahead["verdict"] == "earlier" and ahead["median"] == 40 and ahead["ci"][0] > 0
    with pytest.raises(ValueError, match="the same runs"):
        rs.paired_lead(a, a[:2])


def test_holm_by_hand():
    got = rs.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    # m = 3: a 3 × 0.01 = 0.03; c max(0.03, 2 × 0.03) = 0.06; b max(0.06, 1 × 0.04) = 0.06
    assert {k: v["p_holm"] for k, v in got.items()} == {"a": pytest.approx(0.03), "c": pytest.approx(0.06),
                                                         "b": pytest.approx(0.06), "d": None}
    assert [k for k, v in got.items() if v["holds"]] == ["a"]


def test_cross_fitting_judges_every_seed_by_a_choice_made_without_it():
    items = [rs.Watched(s, 0, 10, None, s) for s in range(4)]
    got = rs.cross_fit(items, choose=lambda xs: sorted(x.seed for x in xs),
                        judge_with=lambda xs, chosen: [(x.seed, tuple(chosen)) for x in xs])
    assert [f["choosing_seeds"] for f in got["folds"]] == [(0, 2), (1, 3)]
    assert sorted(got["judged"]) == [(0, (1, 3)), (1, (0, 2)), (2, (1, 3)), (3, (0, 2))]


def test_the_auc_by_hand_and_its_seed_interval():
    scored = [(0.9, True), (0.8, False), (0.7, True), (0.7, False), (0.1, False)]
    # positives 0.9, 0.7 against negatives 0.8, 0.7, 0.1: 1 + 1 + 1 + 0 + ½ + 1 = 4.5 of 6
    assert rs.auc(scored) == pytest.approx(0.75)
    assert rs.auc([(0.5, True)]) is None
    # every seed holds one positive above one negative: every resample separates perfectly
    got = rs.auc_interval([(s, 0.9, True) for s in range(4)] + [(s, 0.2, False) for s in range(4)])
    assert got == {"auc": 1.0, "ci": (1.0, 1.0)}
    mixed = rs.auc_interval([(0, 0.9, True), (0, 0.2, False), (1, 0.1, True), (1, 0.6, False)])
    assert mixed["auc"] == pytest.approx(0.5) and mixed["ci"][0] < 0.5 < mixed["ci"][1]


def test_the_threshold_chosen_has_the_most_hits_under_the_false_alarm_limit():
    def runs(alarms):  # two breaks at 500, two runs that held 100 … 1,100 (2,000 at-risk steps)
        return [rs.Watched(s, 100, 1100 if s > 1 else 500, 500 if s < 2 else None, a) for s, a in enumerate(alarms)]

    by = {10: runs([200, 300, 900, None]),  # 2 hits, 1 false alarm: 0.5 per 1,000 steps
          30: runs([400, 450, None, None]),  # 2 hits (leads 100, 50), none false
          100: runs([300, None, None, None]),  # 1 hit (lead 200)
          300: runs([None, None, None, None])}
    assert rs.choose_threshold(by) == 30  # 10 has as many hits but 0.5 > 0.05 false alarms per 1,000
    assert rs.choose_threshold(by, max_per_1000=0.5) == 10  # 10 and 30 tie on hits; 10's median lead 250 > 75
    assert rs.choose_threshold({10: by[10]}) is None


def test_holm_adjusts_by_hand_caps_at_one_holds_at_exactly_alpha_and_leaves_untested_out():
    got = rs.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    # m = 3 tested: 3 × 0.01 = 0.03; max(0.03, 2 × 0.03) = 0.06; max(0.06, 1 × 0.04) = 0.06
    assert got == {"a": {"p": 0.01, "p_holm": pytest.approx(0.03), "holds": True},
                   "c": {"p": 0.03, "p_holm": pytest.approx(0.06), "holds": False},
                   "b": {"p": 0.04, "p_holm": pytest.approx(0.06), "holds": False},
                   "d": {"p": None, "p_holm": None, "holds": False}}
    assert rs.holm({"x": 0.6, "y": 0.7}) == {"x": {"p": 0.6, "p_holm": 1.0, "holds": False},
                                              "y": {"p": 0.7, "p_holm": 1.0, "holds": False}}
    assert rs.holm({"only": 0.05}) == {"only": {"p": 0.05, "p_holm": 0.05, "holds": True}}


def _broke(seed, alarm, broke=500):
    return rs.Watched(seed, 0, broke, broke, alarm)


def test_a_tie_in_hits_goes_to_the_longer_median_lead_then_to_the_earlier_threshold():
    held = rs.Watched(9, 0, 1000, None, None)  # a silent held run: 0 false alarms in 1,000 steps
    # both warn all three breaks; leads 10, 20, 90 (median 20) against 40, 41, 42 (median 41, smaller max)
    short = [_broke(0, 490), _broke(1, 480), _broke(2, 410), held]
    long = [_broke(0, 460), _broke(1, 459), _broke(2, 458), held]
    assert rs.choose_threshold({1.0: short, 2.0: long}) == 2.0
    assert rs.choose_threshold({1.0: long, 2.0: short}) == 1.0
    assert rs.choose_threshold({1.0: long, 2.0: list(long)}) == 1.0  # all equal: the earlier
    missed = [_broke(0, None), _broke(1, None), _broke(2, 480), held]  # one hit, lead 20
    none = [_broke(0, None), _broke(1, None), _broke(2, None), held]  # no hit: no median lead
    assert rs.choose_threshold({1.0: none, 2.0: missed}) == 2.0
    assert rs.choose_threshold({1.0: none, 2.0: list(none)}) == 1.0
    # the median, not another quantile: leads 1, 30, 100 (median 30) lose to 35, 35, 36 (median 35), though
    # their upper quantiles are higher
    spread_out = [_broke(0, 499), _broke(1, 470), _broke(2, 400), held]
    steady = [_broke(0, 465), _broke(1, 465), _broke(2, 464), held]
    assert rs.choose_threshold({1.0: spread_out, 2.0: steady}) == 2.0


def test_cross_fitting_names_each_folds_choosing_and_judged_seeds_and_its_choice():
    items = [rs.Watched(s, 0, 10, None, None) for s in range(4)]
    got = rs.cross_fit(items, choose=lambda xs: sorted(x.seed for x in xs),
                        judge_with=lambda xs, c: [(x.seed, tuple(c)) for x in xs])
    assert got["folds"] == [{"choosing_seeds": (0, 2), "judged_seeds": (1, 3), "choice": [0, 2]},
                            {"choosing_seeds": (1, 3), "judged_seeds": (0, 2), "choice": [1, 3]}]
    assert got["judged"] == [(1, (0, 2)), (3, (0, 2)), (0, (1, 3)), (2, (1, 3))]


def test_the_auc_interval_resamples_seeds_with_their_runs_as_often_as_told():
    scored = [(0, 0.9, True), (0, 0.1, False), (1, 0.8, True), (1, 0.7, False), (2, 0.2, True), (2, 0.6, False),
              (3, 0.5, True), (3, 0.4, False)]

    def stat(sample):
        return rs.auc([(s, y) for _, s, y in sample])

    by_seed = det.bootstrap(scored, stat, seed_of=lambda t: t[0], draws=1000)
    # positives 0.9 and 0.8 beat all four negatives, 0.2 beats 0.1, 0.5 beats 0.1 and 0.4: 11 of 16 pairs
    assert rs.auc_interval(scored) == {"auc": pytest.approx(11 / 16), "ci": by_seed}
    assert rs.auc_interval(scored, draws=50)["ci"] == det.bootstrap(scored, stat, seed_of=lambda t: t[0], draws=50)
    assert by_seed != det.bootstrap(scored, stat, seed_of=lambda t: t[1], draws=1000)  # by run, not by seed
    # 1,000 resamples by default, told apart from any other count where the resampled AUCs rarely tie
    rng = random.Random(3)
    many = [(seed, rng.random(), positive) for seed in range(40) for positive in (True, False, rng.random() < 0.5)]
    assert rs.auc_interval(many)["ci"] == det.bootstrap(many, stat, seed_of=lambda t: t[0], draws=1000)
    assert rs.auc_interval(many)["ci"] != det.bootstrap(many, stat, seed_of=lambda t: t[0], draws=1001)


def test_a_paired_lead_reads_earlier_later_or_inconclusive_from_its_seed_interval_and_its_sign_test_by_hand():
    def runs(alarms, broke=500):
        return [rs.Watched(s, 0, broke, broke, a) for s, a in enumerate(alarms)]

    base = runs([499, 499, 499, 499])  # the baseline warns each break one step ahead
    later = rs.paired_lead(runs([None, None, None, 500]), base)  # a misses or warns at the break: −1 each
    assert (later["runs"], later["median"], later["verdict"]) == (4, -1, "later")
    earlier = rs.paired_lead(runs([498, 498, 498, 497]), base)  # one or two steps more: differences 1, 1, 1, 2
    assert (earlier["median"], earlier["ci"][0], earlier["verdict"]) == (1, 1, "earlier")
    # four seeds, all ahead: 2 · P(Binomial(4, ½) ≤ 0) = 2/16
    assert earlier["p"] == pytest.approx(2 / 16)
    # the interval resamples seeds, each bringing all its runs: two runs a seed, differences 3 and −1 in each
    two = [rs.Watched(s, 0, 500, 500, a) for s in range(3) for a in (497, 501)]
    both = rs.paired_lead(two, [rs.Watched(s, 0, 500, 500, 500) for s in range(3) for _ in (0, 1)])
    pairs = [(s, d) for s in range(3) for d in (3, 0)]
    assert both["ci"] == det.bootstrap(pairs, lambda p: det.quantile([d for _, d in p], 0.5), seed_of=lambda p: p[0])
    with pytest.raises(ValueError, match="^paired_lead needs the same runs, in the same order, under both detectors$"):
        rs.paired_lead(runs([1]), runs([1, 2]))


def test_the_sign_test_by_hand_capped_at_one():
    assert rs.sign_test([1, -1]) == 1.0  # 2 × P(X ≤ 1 | n = 2) = 1.5, capped
    assert rs.sign_test([2, 3, 4]) == pytest.approx(2 / 8)


def test_a_paired_lead_whose_interval_ends_at_zero_is_inconclusive():
    base = [rs.Watched(s, 0, 500, 500, 499) for s in range(4)]
    a = [rs.Watched(s, 0, 500, 500, None if s < 2 else 499) for s in range(4)]  # differences −1, −1, 0, 0
    got = rs.paired_lead(a, base)
    assert got["ci"][1] == 0 and got["verdict"] == "inconclusive"
