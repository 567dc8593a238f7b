"""analysis.detectors on hand-made series: the break rule at its edges, each detector's number and first
alarm, hits, false alarms and lead times, the threshold sweep and choice, quantiles, the seed bootstrap
and the held-out split; every number worked out by hand in the comments."""

import math
import random

import pytest

from attnscale.analysis import detectors as det

# 40 steps, ten of each level: median 1.15, MAD 0.1, robust SD 0.14826; 6 SDs above the median: 2.03956
ALT = [1.0, 1.1, 1.2, 1.3] * 10


def _series(losses, final=1.0, probes=()):
    return det.Series(tuple(losses), tuple(probes), final)


# ---- the break rule -----------------------------------------------------------------------------


def test_a_non_finite_loss_breaks_the_run_at_its_step():
    assert det.break_point(_series([1.0] * 30 + [None], final=None), floor=None) == det.Break(30, "non-finite")
    assert det.break_point(_series([1.0] * 30 + [math.inf], final=None), floor=None) == det.Break(30, "non-finite")


def test_a_spike_that_stays_up_breaks_the_run_where_it_starts():
    # steps 40 … 69 at 3.0, above 2.03956; none of the next 20 comes back under the line
    assert det.break_point(_series(ALT + [3.0] * 30), floor=None) == det.Break(40, "spike")


def test_a_spike_back_under_the_line_at_the_twentieth_step_after_is_no_break():
    # up at steps 40 … 59, back at 60: within steps 41 … 60, the 20 after step 40 (and within reach of
    # every later step of the jump)
    losses = ALT + [3.0] * 20 + ALT
    assert det.break_point(_series(losses), floor=None) is None
    # allowed 19 steps, the same jump is a break at 40
    assert det.break_point(_series(losses), floor=None, rule=det.BreakRule(recover=19)) == det.Break(40, "spike")
    # one step longer (back at 61) breaks under the default 20
    assert det.break_point(_series(ALT + [3.0] * 21 + ALT), floor=None) == det.Break(40, "spike")


def test_a_jump_under_the_line_is_no_spike():
    # 2.03 < 2.03956 (6 robust SDs over the median 1.15)
    assert det.break_point(_series(ALT + [2.03] * 40), floor=None) is None
    # 2.05 > 2.03956
    assert det.break_point(_series(ALT + [2.05] * 40), floor=None) == det.Break(40, "spike")
    # a 5-SD rule draws the line at 1.15 + 5 × 0.14826 = 1.8913
    assert det.break_point(_series(ALT + [1.95] * 40), floor=None, rule=det.BreakRule(sigmas=5)) == det.Break(40, "spike")
    assert det.break_point(_series(ALT + [1.95] * 40), floor=None) is None


def test_a_spike_in_the_last_recover_steps_is_not_judged():
    # the jump at step 50 has 9 steps after it, fewer than the 20 its recovery needs
    assert det.break_point(_series(ALT + ALT[:10] + [5.0] * 10), floor=None) is None


def test_a_spike_before_min_history_is_not_judged():
    losses = ALT[:10] + [3.0] * 60  # the jump at step 10; the first step judged is 20, seeing 10 values of 3
    # at step 20: history 10 cycle values + 10 × 3.0 → median (1.3 + 3.0) / 2 = 2.15, and 3.0 is under its line
    assert det.break_point(_series(losses), floor=None) is None


def test_the_floor_breaks_a_run_from_the_last_window_under_it():
    no_spikes = det.BreakRule(sigmas=1e9, plateau=0)
    # 10 × 4.0, 30 × 2.0, 30 × 4.0: the 20-step mean ending at step i ≥ 40 holds i − 39 values of 4.0 and is
    # under 3.0 while i − 39 < 10, last at i = 48; the break is the next window's end, step 49
    losses = [4.0] * 10 + [2.0] * 30 + [4.0] * 30
    assert det.break_point(_series(losses, final=3.5), floor=3.0, rule=no_spikes) == det.Break(49, "floor")
    # held-out loss under the floor: healthy, whatever training did
    assert det.break_point(_series(losses, final=2.9), floor=3.0, rule=no_spikes) is None
    # exactly at the floor is not above it
    assert det.break_point(_series(losses, final=3.0), floor=3.0, rule=no_spikes) is None
    # without the spike switch off, the jump at step 40 (flat history: SD floored at 1e-3) comes first
    assert det.break_point(_series(losses, final=3.5), floor=3.0, rule=det.BreakRule(plateau=0)) == det.Break(40, "spike")


def test_the_plateau_margin_moves_the_line_under_the_unigram_loss():
    # floor 3.1, plateau 0.1: the line is 3.0; a held-out 3.05 is on the plateau, 2.95 is not
    rule = det.BreakRule(sigmas=1e9)
    losses = [4.0] * 10 + [2.0] * 30 + [4.0] * 30
    assert det.break_point(_series(losses, final=3.05), floor=3.1, rule=rule) == det.Break(49, "floor")
    assert det.break_point(_series(losses, final=2.95), floor=3.1, rule=rule) is None
    # the windows' means are held to the same line: the mean ending at i ≥ 40 is 2 + (i − 39) / 10, so a line
    # at 2.5 (floor 2.6) is under the mean once i − 39 ≥ 5: the last window under it ends at 43, the break at 44
    assert det.break_point(_series(losses, final=3.05), floor=2.6, rule=rule) == det.Break(44, "floor")


def test_a_run_never_under_the_floor_is_broken_at_its_first_full_window():
    assert det.break_point(_series([4.0] * 50, final=3.5), floor=3.0) == det.Break(19, "floor")
    assert det.break_point(_series([4.0] * 50, final=2.95), floor=3.0) == det.Break(19, "floor")  # within 0.1


def test_a_run_whose_training_loss_ends_under_the_floor_breaks_at_its_last_step():
    assert det.break_point(_series([2.0] * 50, final=3.5), floor=3.0) == det.Break(49, "floor")
    assert det.break_point(_series([2.0] * 50, final=2.85), floor=3.0) is None  # 0.15 under: off the plateau


def test_no_floor_rule_without_a_floor_or_a_held_out_loss():
    assert det.break_point(_series([4.0] * 50, final=3.5), floor=None) is None
    assert det.break_point(_series([4.0] * 50, final=None), floor=3.0) is None


# ---- signals and first alarms -------------------------------------------------------------------


def _probe(step, **m):
    return (step, {"max_score": [1.0], "effective_words": [4.0], "frozen_fraction": [0.0], **m})


def test_max_score_fewest_words_and_frozen_read_the_worst_head():
    s = _series([1.0] * 10, probes=[_probe(0, max_score=[1.0, 2.0], effective_words=[4.0, 2.0],
                                           frozen_fraction=[0.1, 0.3]),
                                    _probe(5, max_score=[3.0, 150.0], effective_words=[1.5, 3.0],
                                           frozen_fraction=[0.6, 0.2])])
    assert det.signal("max_score", s) == [(0, 2.0), (5, 150.0)]
    assert det.signal("fewest_words", s) == [(0, 2.0), (5, 1.5)]
    assert det.signal("frozen", s) == [(0, 0.3), (5, 0.6)]
    assert det.first_alarm(det.signal("max_score", s), 100) == 5
    assert det.first_alarm(det.signal("max_score", s), 150) is None  # strictly above
    assert det.first_alarm(det.signal("max_score", s), 1.5) == 0
    assert det.first_alarm(det.signal("fewest_words", s), 2.0, below=True) == 5  # 2.0 is not under 2.0
    assert det.first_alarm(det.signal("fewest_words", s), 2.5, below=True) == 0


def test_growth_is_a_heads_max_score_over_its_own_four_probes_before():
    scores = [1.0, 2.0, 4.0, 8.0, 16.0, 20.0]
    s = _series([1.0] * 30, probes=[_probe(5 * i, max_score=[v, 1.0]) for i, v in enumerate(scores)])
    # probe 4 (step 20): 16 / 1; probe 5 (step 25): 20 / 2; the other head stays at 1
    assert det.signal("growth", s) == [(20, 16.0), (25, 10.0)]
    assert det.first_alarm(det.signal("growth", s), 12) == 20


def test_head_spike_is_the_watch_spikes_z_on_the_heads_own_probes():
    scores = [1.0, 3.0, 1.0, 3.0, 1.0, 6.0]
    s = _series([1.0] * 30, probes=[_probe(5 * i, max_score=[v]) for i, v in enumerate(scores)])
    # history 1, 3, 1, 3, 1: mean 1.8, population SD sqrt((3 × 0.64 + 2 × 1.44) / 5) = sqrt(0.96)
    ((step, z),) = det.signal("head_spike", s)
    assert step == 25 and z == pytest.approx((6.0 - 1.8) / math.sqrt(0.96))


def test_head_spike_matches_watch_alerts_spike():
    from attnscale.watch.alerts import Spike

    history = [1.0, 3.0, 1.0, 3.0, 1.0]
    assert det._spike_z(history, 6.0) == pytest.approx(Spike().z(history, 6.0))
    assert det._spike_z([2.0] * 5, 2.5) == pytest.approx(Spike().z([2.0] * 5, 2.5))


def test_non_finite_fires_on_any_nan_or_inf():
    s = _series([1.0] * 10, probes=[_probe(0), _probe(5, effective_words=[math.nan]), _probe(10, max_score=[math.inf])])
    assert det.signal("non_finite", s) == [(0, 0.0), (5, 1.0), (10, 1.0)]
    assert det.first_alarm(det.signal("non_finite", s), 0.5) == 5
    assert det.signal("max_score", s) == [(0, 1.0), (5, 1.0)]  # the inf is non_finite's, not max_score's


def test_the_loss_spike_is_a_robust_z_against_the_last_steps():
    s = _series([1.0, 1.2, 1.0, 1.2, 1.1, 2.0, None])
    # step 5: history 1, 1.2, 1, 1.2, 1.1: median 1.1, MAD 0.1, SD 0.14826; (2.0 − 1.1) / 0.14826
    sig = det.signal("loss_spike", s)
    assert sig[0] == (5, pytest.approx(0.9 / 0.14826)) and sig[1] == (6, math.inf)
    assert det.first_alarm(sig, 6.0) == 5 and det.first_alarm(sig, 6.1) == 6


def test_combined_alarms_take_the_first():
    assert det.combine_alarms(None, 5, 3) == 3
    assert det.combine_alarms(None, None) is None


# ---- judging ------------------------------------------------------------------------------------


def _outcomes():
    return [det.Outcome(0, 200, 100, 60),  # hit, lead 40 (share 0.2)
            det.Outcome(0, 200, 50, 50),  # hit at its very step: lead 0
            det.Outcome(1, 200, 50, 51),  # the alarm after the break: a miss
            det.Outcome(1, 200, 80, None),  # no alarm: a miss
            det.Outcome(2, 200, None, 10),  # healthy with an alarm: a false alarm
            det.Outcome(2, 200, None, None)]


def test_judge_counts_hits_false_alarms_and_leads():
    j = det.judge(_outcomes())
    assert (j["broken"], j["hits"], j["healthy"], j["false_alarms"]) == (4, 2, 2, 1)
    assert j["hit_rate"] == 0.5 and j["false_alarm_rate"] == 0.5
    # leads 0 and 40: median 20, quartiles 10 and 30; shares 0 and 0.2: median 0.1
    assert (j["lead_median"], j["lead_q1"], j["lead_q3"]) == (20, 10, 30)
    assert j["lead_share_median"] == pytest.approx(0.1)


def test_judge_without_broken_or_healthy_runs_gives_no_rate():
    j = det.judge([det.Outcome(0, 10, None, None)])
    assert j["hit_rate"] is None and j["false_alarm_rate"] == 0.0 and j["lead_median"] is None


def _runs():
    # (seed, steps, break, signals): a max_score signal per run
    b = det.Break
    return [(0, 100, b(50, "spike"), {"max_score": [(0, 10.0), (30, 300.0)]}),  # passes 100 at 30: lead 20
            (1, 100, b(40, "floor"), {"max_score": [(0, 10.0), (45, 300.0)]}),  # passes 100 at 45: too late
            (2, 100, None, {"max_score": [(0, 10.0), (20, 150.0)]}),  # healthy, 150
            (3, 100, None, {"max_score": [(0, 10.0), (20, 50.0)]})]  # healthy, 50


def test_sweep_gives_the_curve_over_thresholds():
    pts = det.sweep(_runs(), "max_score", (20, 100, 200, 400))
    assert [(p["threshold"], p["hits"], p["false_alarms"]) for p in pts] == [(20, 1, 2), (100, 1, 1), (200, 1, 0),
                                                                            (400, 0, 0)]
    assert [p["hit_rate"] for p in pts] == [0.5, 0.5, 0.5, 0.0]
    assert [p["false_alarm_rate"] for p in pts] == [1.0, 0.5, 0.0, 0.0]
    assert pts[2]["lead_median"] == 20


def test_choose_takes_the_most_hits_under_the_target():
    pts = det.sweep(_runs(), "max_score", (20, 100, 200, 400))
    assert det.choose(pts, 0.0)["threshold"] == 200  # 1 hit at no false alarm; 400 has none
    assert det.choose(pts, 0.5)["threshold"] == 100  # 100 and 200 both 1 hit, lead 20: the earlier point
    assert det.choose([p for p in pts if p["threshold"] == 20], 0.5) is None


def test_choose_breaks_ties_by_lead():
    pts = [{"threshold": 1, "hit_rate": 0.5, "false_alarm_rate": 0.0, "lead_median": 5},
           {"threshold": 2, "hit_rate": 0.5, "false_alarm_rate": 0.0, "lead_median": 9}]
    assert det.choose(pts, 0.01)["threshold"] == 2


# ---- uncertainty --------------------------------------------------------------------------------


def test_quantile_interpolates_like_numpy():
    assert det.quantile([4, 1, 3, 2], 0.25) == 1.75
    assert det.quantile([4, 1, 3, 2], 0.5) == 2.5
    assert det.quantile([7], 0.9) == 7 and det.quantile([], 0.5) is None


def test_split_seeds_alternates():
    assert det.split_seeds([3, 1, 2, 0, 4]) == ((0, 2, 4), (1, 3))


def test_bootstrap_resamples_seeds_with_their_runs():
    out = _outcomes()

    def rate(sample):
        return det.judge(sample)["hit_rate"]

    # seed 0: both broken runs hit; seed 1: both missed; seed 2 has none broken. Every resample's rate is
    # a share of hits among broken runs, each seed bringing 2 broken runs or none: 0, 1/2, 1 and so on
    lo, hi = det.bootstrap(out, rate, draws=400)
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0 and lo < hi
    assert det.bootstrap(out, rate, draws=400) == (lo, hi)  # seeded: the same every time
    assert det.bootstrap([o for o in out if o.seed == 0], rate) is None  # one seed: no interval
    const = det.bootstrap(out, lambda s: 3.0, draws=50)
    assert const == (3.0, 3.0)


def test_wilson_by_hand():
    # 0 of 15: [0, z² / (n + z²)] = [0, 3.8415 / 18.8415]
    lo, hi_0 = det.wilson(0, 15)
    assert lo == 0.0 and hi_0 == pytest.approx(1.959964 ** 2 / (15 + 1.959964 ** 2), rel=1e-5)
    # 5 of 10: centre 0.5, half-width z·sqrt(0.025 + z²/400) / (1 + z²/10)
    z = 1.959964
    lo, hi = det.wilson(5, 10)
    half = z * math.sqrt(0.025 + z * z / 400) / (1 + z * z / 10)
    assert (lo, hi) == (pytest.approx(0.5 - half, rel=1e-5), pytest.approx(0.5 + half, rel=1e-5))
    assert det.wilson(0, 0) is None
    assert det.wilson(15, 15)[1] == pytest.approx(1.0) and det.wilson(15, 15)[0] == pytest.approx(1 - hi_0, rel=1e-6)


# ---- each detector is the watch's alert: the same first step on the same numbers ----------------


def _watch_first(alert, series, layers=2):
    """The first probe step at which the watch's ``Alerts`` fires ``alert`` on the series' probes."""
    import torch

    from attnscale.capture.stats import HeadStats
    from attnscale.core.diagnostics import HEAD_MEASURES
    from attnscale.watch.alerts import Alerts

    alerts = Alerts([alert])
    for step, m in series.probes:
        heads = len(m["max_score"]) // layers
        values_LMH = torch.ones(layers, len(HEAD_MEASURES), heads)
        for k, vs in m.items():
            values_LMH[:, HEAD_MEASURES.index(k)] = torch.tensor(vs, dtype=torch.float32).view(layers, heads)
        if alerts.check(HeadStats(values_LMH, torch.full((layers, heads), 10.0)), step, say=False):
            return step
    return None


def test_the_detectors_fire_where_the_watch_alerts_do():
    from attnscale.watch.alerts import Collapsed, Frozen, MaxScore, NonFinite, Spike

    scores = [5.0, 7.0, 6.0, 8.0, 6.5, 7.5, 30.0, 120.0, 400.0, math.nan]
    words = [4.0, 3.5, 3.0, 2.5, 2.0, 1.6, 1.2, 1.05, 1.01, 1.0]
    frozen = [0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 0.95, 0.99]
    probes = [(5 * i, {"max_score": [1.0, 2.0, 1.5, s], "effective_words": [9.0, w, 8.0, 7.0],
                       "frozen_fraction": [0.0, 0.0, f, 0.1]}) for i, (s, w, f) in enumerate(zip(scores, words, frozen))]
    s = _series([1.0] * 50, probes=probes)
    for alert, name, th in ((MaxScore(tau=100), "max_score", 100), (MaxScore(tau=20), "max_score", 20),
                            (Collapsed(words=1.1), "fewest_words", 1.1), (Collapsed(words=2), "fewest_words", 2),
                            (Frozen(limit=0.5), "frozen", 0.5), (NonFinite(), "non_finite", 0.5),
                            (Spike(sigmas=6), "head_spike", 6), (Spike(sigmas=20), "head_spike", 20)):
        below = next(d.below for d in det.DETECTORS if d.name == name)
        assert _watch_first(alert, s) == det.first_alarm(det.signal(name, s), th, below), (alert, th)


# ---- the recipe study's detectors: first firing steps -------------------------------------------


def test_max_score_fires_strictly_above_each_level_from_the_start_of_risk():
    points = [(0, 50.0), (10, 100.0), (20, 150.0), (30, 2e4)]
    assert [det.max_score_alarm(points, level) for level in det.LITERATURE_LEVELS] == [20, 30, 30]
    assert det.max_score_alarm(points, 1e2, start=25) == 30
    assert det.max_score_alarm(points, 3e4) is None
    assert det.max_score_alarm([(0, 50.0), (10, math.nan)], 1e4) == 10  # a NaN is past every level


def test_entropy_collapse_is_a_fall_under_a_share_of_the_first_probe():
    points = [(0, 2.0), (10, 1.5), (20, 0.9), (30, 0.1)]
    assert det.entropy_collapse_alarm(points, 0.5) == 20  # 0.9 < 0.5 × 2.0
    assert det.entropy_collapse_alarm(points, 0.45) == 30  # 0.9 is not under 0.9
    assert det.entropy_collapse_alarm(points, 0.01) is None


def test_qk_weight_growth_is_a_rise_over_a_factor_of_the_first_probe():
    points = [(0, 0.5), (10, 0.9), (20, 1.0), (30, 1.1)]
    assert det.qk_rms_growth_alarm(points, 2) == 30  # 1.0 is not above 2 × 0.5
    assert det.qk_rms_growth_alarm(points, 1.9) == 20  # 0.9 is not above 0.95; 1.0 is
    # the reference is the first finite value; a missing (non-finite) one fires where it is at risk
    assert det.qk_rms_growth_alarm([(0, None), (10, 0.5), (20, 0.75)], 1.25, start=10) == 20
    assert det.qk_rms_growth_alarm([(0, None), (10, 0.5), (20, 0.75)], 1.25) == 0


def test_log_z_drift_counts_either_direction():
    points = [(0, 4.5), (10, 4.0), (20, 2.5), (30, 7.0)]
    assert det.log_z_drift_alarm(points, 2) == 30  # |2.5 − 4.5| = 2 is not more than 2; |7 − 4.5| = 2.5 is
    assert det.log_z_drift_alarm(points, 1.5) == 20
    assert det.log_z_drift_alarm([(0, math.nan), (10, math.inf)], 1.5, start=5) == 10  # no reference: still fires


def test_the_loss_spike_detector_by_hand():
    # ALT: median 1.15, robust SD 0.14826, 6 SDs above: 2.03956
    assert det.loss_spike_alarm(ALT + [2.03], 6) is None
    assert det.loss_spike_alarm(ALT + [2.05], 6) == 40
    assert det.loss_spike_alarm(ALT + [None], 1e9) == 40  # a non-finite loss fires
    assert det.loss_spike_alarm([1.0, 1.3, 9.0] + ALT, 6) is None  # 2 steps of history at the jump: not judged
    assert det.loss_spike_alarm(ALT + [2.05] + ALT, 6, start=41) is None  # the spike came before the risk


def test_the_gradient_norm_spike_reads_only_its_window():
    alt20 = ALT[:20]  # five cycles: the same median, MAD and line 2.03956
    pts = [(10 * i, v) for i, v in enumerate([10.0] * 100 + alt20 + [2.05])]
    assert det.grad_norm_spike_alarm(pts, 6) == 1200  # the 100 earlier 10.0s are out of its 20-point window
    pts = [(10 * i, v) for i, v in enumerate(alt20 + [2.03])]
    assert det.grad_norm_spike_alarm(pts, 6) is None


# ---- the recipe study: judging within a cell -----------------------------------------------------

WATCHED = [det.Watched(0, 100, 300, 300, 250),  # hit, lead 50
           det.Watched(1, 100, 400, 400, 400),  # an alarm at the break itself: no warning
           det.Watched(2, 100, 500, 500, None),  # missed
           det.Watched(3, 100, 1000, None, None),  # held, silent: 900 steps at risk
           det.Watched(4, 200, 1000, None, 600)]  # held, a false alarm: 800 steps at risk


def test_the_hit_rate_counts_only_alarms_before_the_break():
    got = det.hit_rate(WATCHED)
    assert (got["hits"], got["breaks"], got["rate"]) == (1, 3, pytest.approx(1 / 3))
    # Wilson, 1 of 3, z = 1.959964: centre (1/3 + z²/6)/(1 + z²/3) = 0.42692, half-width 0.36543
    assert got["ci"] == (pytest.approx(0.06149, abs=1e-4), pytest.approx(0.79234, abs=1e-4))
    assert [w.lead for w in WATCHED] == [50, None, None, None, None]


def test_false_alarms_per_thousand_at_risk_steps_of_the_runs_that_held():
    got = det.false_alarms_per_1000(WATCHED)
    assert (got["false_alarms"], got["at_risk_steps"]) == (1, 1700)
    assert got["per_1000"] == pytest.approx(1000 / 1700)
    # a third of the resamples hold no seed 4 (0.8⁵ = 0.33): rate 0; none can exceed seed 4 alone, 1000/800
    assert got["ci"][0] == 0 and got["ci"][1] <= 1.25


def test_no_false_alarm_gives_the_exact_poisson_upper_bound_not_a_point_at_zero():
    quiet = [det.Watched(s, 0, 500, None, None) for s in range(4)]  # 2,000 steps held, no alarm
    got = det.false_alarms_per_1000(quiet)
    assert (got["false_alarms"], got["per_1000"]) == (0, 0.0)
    # P(0 events | mean m) = e^-m = 0.025 at m = 3.689: per 1,000 steps of 2,000, 1.844
    assert got["ci"] == (0.0, pytest.approx(1000 * 3.6888794541139363 / 2000))


def test_the_sign_test_by_hand():
    assert det.sign_test([1, 2, 3, -1, 0]) == pytest.approx(2 * (1 + 4) / 16)  # 3 up, 1 down, a zero dropped
    assert det.sign_test([1] * 6) == pytest.approx(2 / 64)
    assert det.sign_test([0, 0]) is None and det.sign_test([]) is None


def test_the_paired_lead_counts_a_miss_as_no_lead():
    def runs(alarms):
        return [det.Watched(s, 0, 200, 200 if s < 3 else None, a) for s, a in enumerate(alarms)]

    a, b = runs([150, 170, None, 50]), runs([180, None, 190, None])  # leads a 50, 30, 0; b 20, 0, 10
    got = det.paired_lead(a, b)
    assert (got["runs"], got["median"]) == (3, 30)  # differences 30, 30, −10
    assert got["p"] == pytest.approx(2 * (1 + 3) / 8) and got["verdict"] == "inconclusive"
    # a resample of three seeds holds seed 2 twice or more 7 times in 27: the lower end is −10
    assert got["ci"][0] == -10
    ahead = det.paired_lead(runs([150, 170, 160, None]), runs([None, None, None, None]))
    assert ahead["verdict"] == "earlier" and ahead["median"] == 40 and ahead["ci"][0] > 0
    with pytest.raises(ValueError, match="the same runs"):
        det.paired_lead(a, a[:2])


def test_holm_by_hand():
    got = det.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    # m = 3: a 3 × 0.01 = 0.03; c max(0.03, 2 × 0.03) = 0.06; b max(0.06, 1 × 0.04) = 0.06
    assert {k: v["p_holm"] for k, v in got.items()} == {"a": pytest.approx(0.03), "c": pytest.approx(0.06),
                                                         "b": pytest.approx(0.06), "d": None}
    assert [k for k, v in got.items() if v["holds"]] == ["a"]


def test_cross_fitting_judges_every_seed_by_a_choice_made_without_it():
    items = [det.Watched(s, 0, 10, None, s) for s in range(4)]
    got = det.cross_fit(items, choose=lambda xs: sorted(x.seed for x in xs),
                        judge_with=lambda xs, chosen: [(x.seed, tuple(chosen)) for x in xs])
    assert [f["choosing_seeds"] for f in got["folds"]] == [(0, 2), (1, 3)]
    assert sorted(got["judged"]) == [(0, (1, 3)), (1, (0, 2)), (2, (1, 3)), (3, (0, 2))]


def test_the_auc_by_hand_and_its_seed_interval():
    scored = [(0.9, True), (0.8, False), (0.7, True), (0.7, False), (0.1, False)]
    # positives 0.9, 0.7 against negatives 0.8, 0.7, 0.1: 1 + 1 + 1 + 0 + ½ + 1 = 4.5 of 6
    assert det.auc(scored) == pytest.approx(0.75)
    assert det.auc([(0.5, True)]) is None
    # every seed holds one positive above one negative: every resample separates perfectly
    got = det.auc_interval([(s, 0.9, True) for s in range(4)] + [(s, 0.2, False) for s in range(4)])
    assert got == {"auc": 1.0, "ci": (1.0, 1.0)}
    mixed = det.auc_interval([(0, 0.9, True), (0, 0.2, False), (1, 0.1, True), (1, 0.6, False)])
    assert mixed["auc"] == pytest.approx(0.5) and mixed["ci"][0] < 0.5 < mixed["ci"][1]


def test_the_threshold_chosen_has_the_most_hits_under_the_false_alarm_limit():
    def runs(alarms):  # two breaks at 500, two runs that held 100 … 1,100 (2,000 at-risk steps)
        return [det.Watched(s, 100, 1100 if s > 1 else 500, 500 if s < 2 else None, a) for s, a in enumerate(alarms)]

    by = {10: runs([200, 300, 900, None]),  # 2 hits, 1 false alarm: 0.5 per 1,000 steps
          30: runs([400, 450, None, None]),  # 2 hits (leads 100, 50), none false
          100: runs([300, None, None, None]),  # 1 hit (lead 200)
          300: runs([None, None, None, None])}
    assert det.choose_threshold(by) == 30  # 10 has as many hits but 0.5 > 0.05 false alarms per 1,000
    assert det.choose_threshold(by, max_per_1000=0.5) == 10  # 10 and 30 tie on hits; 10's median lead 250 > 75
    assert det.choose_threshold({10: by[10]}) is None


# ---- the study's statistics at their edges, each against a hand calculation ---------------------------------


def test_holm_adjusts_by_hand_caps_at_one_holds_at_exactly_alpha_and_leaves_untested_out():
    got = det.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    # m = 3 tested: 3 × 0.01 = 0.03; max(0.03, 2 × 0.03) = 0.06; max(0.06, 1 × 0.04) = 0.06
    assert got == {"a": {"p": 0.01, "p_holm": pytest.approx(0.03), "holds": True},
                   "c": {"p": 0.03, "p_holm": pytest.approx(0.06), "holds": False},
                   "b": {"p": 0.04, "p_holm": pytest.approx(0.06), "holds": False},
                   "d": {"p": None, "p_holm": None, "holds": False}}
    assert det.holm({"x": 0.6, "y": 0.7}) == {"x": {"p": 0.6, "p_holm": 1.0, "holds": False},
                                              "y": {"p": 0.7, "p_holm": 1.0, "holds": False}}
    assert det.holm({"only": 0.05}) == {"only": {"p": 0.05, "p_holm": 0.05, "holds": True}}


def _broke(seed, alarm, broke=500):
    return det.Watched(seed, 0, broke, broke, alarm)


def test_a_tie_in_hits_goes_to_the_longer_median_lead_then_to_the_earlier_threshold():
    held = det.Watched(9, 0, 1000, None, None)  # a silent held run: 0 false alarms in 1,000 steps
    # both warn all three breaks; leads 10, 20, 90 (median 20) against 40, 41, 42 (median 41, smaller max)
    short = [_broke(0, 490), _broke(1, 480), _broke(2, 410), held]
    long = [_broke(0, 460), _broke(1, 459), _broke(2, 458), held]
    assert det.choose_threshold({1.0: short, 2.0: long}) == 2.0
    assert det.choose_threshold({1.0: long, 2.0: short}) == 1.0
    assert det.choose_threshold({1.0: long, 2.0: list(long)}) == 1.0  # all equal: the earlier
    missed = [_broke(0, None), _broke(1, None), _broke(2, 480), held]  # one hit, lead 20
    none = [_broke(0, None), _broke(1, None), _broke(2, None), held]  # no hit: no median lead
    assert det.choose_threshold({1.0: none, 2.0: missed}) == 2.0
    assert det.choose_threshold({1.0: none, 2.0: list(none)}) == 1.0
    # the median, not another quantile: leads 1, 30, 100 (median 30) lose to 35, 35, 36 (median 35), though
    # their upper quantiles are higher
    spread_out = [_broke(0, 499), _broke(1, 470), _broke(2, 400), held]
    steady = [_broke(0, 465), _broke(1, 465), _broke(2, 464), held]
    assert det.choose_threshold({1.0: spread_out, 2.0: steady}) == 2.0


def test_cross_fitting_names_each_folds_choosing_and_judged_seeds_and_its_choice():
    items = [det.Watched(s, 0, 10, None, None) for s in range(4)]
    got = det.cross_fit(items, choose=lambda xs: sorted(x.seed for x in xs),
                        judge_with=lambda xs, c: [(x.seed, tuple(c)) for x in xs])
    assert got["folds"] == [{"choosing_seeds": (0, 2), "judged_seeds": (1, 3), "choice": [0, 2]},
                            {"choosing_seeds": (1, 3), "judged_seeds": (0, 2), "choice": [1, 3]}]
    assert got["judged"] == [(1, (0, 2)), (3, (0, 2)), (0, (1, 3)), (2, (1, 3))]


def test_the_auc_interval_resamples_seeds_with_their_runs_as_often_as_told():
    scored = [(0, 0.9, True), (0, 0.1, False), (1, 0.8, True), (1, 0.7, False), (2, 0.2, True), (2, 0.6, False),
              (3, 0.5, True), (3, 0.4, False)]

    def stat(sample):
        return det.auc([(s, y) for _, s, y in sample])

    by_seed = det.bootstrap(scored, stat, seed_of=lambda t: t[0], draws=1000)
    # positives 0.9 and 0.8 beat all four negatives, 0.2 beats 0.1, 0.5 beats 0.1 and 0.4: 11 of 16 pairs
    assert det.auc_interval(scored) == {"auc": pytest.approx(11 / 16), "ci": by_seed}
    assert det.auc_interval(scored, draws=50)["ci"] == det.bootstrap(scored, stat, seed_of=lambda t: t[0], draws=50)
    assert by_seed != det.bootstrap(scored, stat, seed_of=lambda t: t[1], draws=1000)  # by run, not by seed
    # 1,000 resamples by default, told apart from any other count where the resampled AUCs rarely tie
    rng = random.Random(3)
    many = [(seed, rng.random(), positive) for seed in range(40) for positive in (True, False, rng.random() < 0.5)]
    assert det.auc_interval(many)["ci"] == det.bootstrap(many, stat, seed_of=lambda t: t[0], draws=1000)
    assert det.auc_interval(many)["ci"] != det.bootstrap(many, stat, seed_of=lambda t: t[0], draws=1001)


def test_a_paired_lead_reads_earlier_later_or_inconclusive_from_its_seed_interval_and_its_sign_test_by_hand():
    def runs(alarms, broke=500):
        return [det.Watched(s, 0, broke, broke, a) for s, a in enumerate(alarms)]

    base = runs([499, 499, 499, 499])  # the baseline warns each break one step ahead
    later = det.paired_lead(runs([None, None, None, 500]), base)  # a misses or warns at the break: −1 each
    assert (later["runs"], later["median"], later["verdict"]) == (4, -1, "later")
    earlier = det.paired_lead(runs([498, 498, 498, 497]), base)  # one or two steps more: differences 1, 1, 1, 2
    assert (earlier["median"], earlier["ci"][0], earlier["verdict"]) == (1, 1, "earlier")
    # four seeds, all ahead: 2 · P(Binomial(4, ½) ≤ 0) = 2/16
    assert earlier["p"] == pytest.approx(2 / 16)
    # the interval resamples seeds, each bringing all its runs: two runs a seed, differences 3 and −1 in each
    two = [det.Watched(s, 0, 500, 500, a) for s in range(3) for a in (497, 501)]
    both = det.paired_lead(two, [det.Watched(s, 0, 500, 500, 500) for s in range(3) for _ in (0, 1)])
    pairs = [(s, d) for s in range(3) for d in (3, 0)]
    assert both["ci"] == det.bootstrap(pairs, lambda p: det.quantile([d for _, d in p], 0.5), seed_of=lambda p: p[0])
    with pytest.raises(ValueError, match="^paired_lead needs the same runs, in the same order, under both detectors$"):
        det.paired_lead(runs([1]), runs([1, 2]))


def test_the_sign_test_by_hand_capped_at_one():
    assert det.sign_test([1, -1]) == 1.0  # 2 × P(X ≤ 1 | n = 2) = 1.5, capped
    assert det.sign_test([2, 3, 4]) == pytest.approx(2 / 8)


def test_alarms_fire_from_their_start_on_its_own_step():
    assert det.max_score_alarm([(0, 2000.0), (10, 5.0)], 1000) == 0  # the first probe counts
    broken_first = [(0, math.nan), (10, 1.0)]  # a first probe that is not finite fires every detector there
    assert det.entropy_collapse_alarm(broken_first, 0.5) == det.log_z_drift_alarm(broken_first, 1.0) == 0
    assert det.spike_alarm([], 6, 50, start=5, scores=[(5, 10.0), (9, 12.0)]) == 5  # scores given are read
    # a point that is not finite scores +inf and the points after it are still scored
    points = [(s, 1.0) for s in range(25)] + [(25, math.nan)] + [(s, 1.0) for s in range(26, 40)] + [(40, 50.0)]
    assert det.spike_alarm(points, 6, 50, start=30) == 40


def test_spike_edges_the_first_scored_point_a_score_at_the_threshold_and_the_start_each_alarm_is_given():
    flat = [(s, 1.0) for s in range(det.SPIKE_MIN + 1)]
    assert [step for step, _ in det.spike_scores(flat, 50)] == [det.SPIKE_MIN]  # once SPIKE_MIN points exist
    assert det.spike_alarm([], 6, 50, scores=[(3, 6.0)]) is None  # more than 6 robust SDs, not 6
    assert det.spike_alarm([(s, 1.0) for s in range(4)] + [(4, 99.0)], 6, 50, min_history=3) == 4
    assert det.loss_spike_alarm([math.nan, 1.0], 6) == 0 and det.grad_norm_spike_alarm([(0, math.inf)], 6) == 0
    assert det.spike_alarm([(0, math.nan)], 6, 50) == 0
    points = [(0, math.inf)] + [(s, 1.0) for s in range(1, 30)] + [(30, 99.0)]
    assert det.grad_norm_spike_alarm(points, 6, start=5) == 30


def test_a_paired_lead_whose_interval_ends_at_zero_is_inconclusive():
    base = [det.Watched(s, 0, 500, 500, 499) for s in range(4)]
    a = [det.Watched(s, 0, 500, 500, None if s < 2 else 499) for s in range(4)]  # differences −1, −1, 0, 0
    got = det.paired_lead(a, base)
    assert got["ci"][1] == 0 and got["verdict"] == "inconclusive"


@pytest.mark.parametrize(("ci", "verdict"), [
    (None, "inconclusive"), ((0.5, 3.0), "earlier"), ((1.0, 1.0), "earlier"), ((-3.0, -0.5), "later"),
    ((-1.0, -1.0), "later"), ((0.0, 0.0), "inconclusive"), ((0.0, 2.0), "inconclusive"),
    ((-2.0, 0.0), "inconclusive"), ((-2.0, 0.5), "inconclusive"), ((-0.5, 2.0), "inconclusive"),
])
def test_a_lead_verdict_is_earlier_or_later_only_where_the_interval_leaves_out_zero(ci, verdict):
    assert det.lead_verdict(ci) == verdict


# ---- the break rule and the detectors' signals at their edges, from their definitions -------------------


def test_a_loss_exactly_on_the_spike_line_is_no_spike():
    """'More than six robust SDs above the median': a flat history (MAD 0, the SD floored at 1e-3) draws the
    line at 1 + 6e-3; a loss exactly on it neither starts a spike nor keeps one going."""
    line = 1.0 + 6.0 * 1e-3
    at_line_then_up = [1.0] * 50 + [line] + [2.0] * 30
    assert det.break_point(_series(at_line_then_up, final=None), None) == det.Break(51, "spike")  # not at 50
    up_then_at_line = [1.0] * 50 + [2.0] + [line] * 30
    assert det.break_point(_series(up_then_at_line, final=None), None) is None  # it never stays above


def test_a_spike_must_hold_from_the_very_next_step():
    back_for_one = [1.0] * 50 + [2.0, 1.0] + [2.0] * 30
    # step 50 comes back under the line at 51: no spike there; from 52 on it holds (the one 2.0 before is
    # no more than one in fifty, so the median and MAD of the history are still 1 and 0)
    assert det.break_point(_series(back_for_one, final=None), None) == det.Break(52, "spike")


def test_a_loss_that_is_not_finite_ends_the_search_for_a_spike_there():
    """Nothing after the first non-finite loss is read: the run broke there."""
    losses = [1.0] * 30 + [None] + [1.0] * 40
    assert det.break_point(_series(losses, final=None), None) == det.Break(30, "non-finite")


def test_the_losss_own_detector_reads_from_step_5_and_past_a_loss_that_is_not_finite():
    assert det.signal("loss_spike", _series([1.0, 1.0, None])) == []  # fewer than 5 steps: not read
    got = det.signal("loss_spike", _series([1.0] * 10 + [None] + [1.0] * 10))
    assert [s for s, _ in got] == list(range(5, 21))
    assert dict(got)[10] == math.inf and all(v == 0.0 for s, v in got if s != 10)


def _probes(*values_by_probe):
    """A probe every 5 steps, each with the heads' max scores given."""
    return tuple((5 * i, {"max_score": list(vs)}) for i, vs in enumerate(values_by_probe))


def test_a_head_whose_score_is_not_finite_is_left_out_and_the_others_still_read():
    probes = _probes(*[(1.0, 1.0)] * 5, (math.nan, 8.0))
    # head 1: 8 over its value 4 probes before, 1; head 0, NaN, is left out (non_finite's business)
    assert det.signal("growth", _series([1.0] * 30, probes=probes))[-1] == (25, 8.0)
    z = det.signal("head_spike", _series([1.0] * 30, probes=probes))[-1]
    assert z[0] == 25 and z[1] == pytest.approx((8.0 - 1.0) / 1e-6, rel=1e-9)  # a flat history: SD floored at 1e-6


def test_growth_over_a_score_of_zero_is_not_read_and_a_spike_over_zeros_is_huge():
    probes = _probes(*[(0.0,)] * 5, (1.0,))
    assert det.signal("growth", _series([1.0] * 30, probes=probes)) == []  # read only over a score above 0
    # a history of zeros: the SD floored at 1e-12, so one step to 1 is 1e12 SDs
    assert det.signal("head_spike", _series([1.0] * 30, probes=probes)) == [(25, pytest.approx(1e12, rel=1e-9))]


def test_the_bootstrap_interval_is_the_2_5th_and_97_5th_percentiles_of_1000_seed_resamples_by_hand():
    rng = random.Random(5)
    items = [det.Watched(seed, 0, 100, 100, 100 - rng.randrange(1, 90)) for seed in range(30)]

    def stat(sample):
        return sum(w.lead for w in sample) / len(sample)

    # by hand: 1,000 draws of 30 seeds with replacement from random.Random(0), each seed bringing its runs
    draw, seeds, values = random.Random(0), sorted({w.seed for w in items}), []
    for _ in range(1000):
        picked = [draw.choice(seeds) for _ in seeds]
        values.append(stat([w for s in picked for w in items if w.seed == s]))
    values.sort()

    def pct(q):  # numpy's default: linear between order statistics
        pos = q * (len(values) - 1)
        lo = math.floor(pos)
        return values[lo] + (values[min(lo + 1, len(values) - 1)] - values[lo]) * (pos - lo)

    got = det.bootstrap(items, stat)
    assert got == pytest.approx((pct(0.025), pct(0.975)), rel=1e-12)
    assert got != det.bootstrap(items, stat, rng_seed=1) and got != det.bootstrap(items, stat, draws=1001)
