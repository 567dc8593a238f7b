"""analysis.detectors on hand-made series: each detector's number and first alarm, the first round's hits,
false alarms and lead times, the threshold sweep and choice, quantiles, the seed bootstrap and the held-out
split; every number worked out by hand in the comments (the break rules: test_outcomes.py)."""

import math
import random

from collections import namedtuple

import pytest

from attnscale.analysis import detectors as det
from attnscale.analysis import outcomes as oc

# 40 steps, ten of each level: median 1.15, MAD 0.1, robust SD 0.14826; 6 SDs above the median: 2.03956
ALT = [1.0, 1.1, 1.2, 1.3] * 10


def _series(losses, final=1.0, probes=()):
    return det.Series(tuple(losses), tuple(probes), final)


# ---- the break rule -----------------------------------------------------------------------------


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
    b = oc.Break
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


# ---- the study's statistics at their edges, each against a hand calculation ---------------------------------


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


@pytest.mark.parametrize(("ci", "verdict"), [
    (None, "inconclusive"), ((0.5, 3.0), "earlier"), ((1.0, 1.0), "earlier"), ((-3.0, -0.5), "later"),
    ((-1.0, -1.0), "later"), ((0.0, 0.0), "inconclusive"), ((0.0, 2.0), "inconclusive"),
    ((-2.0, 0.0), "inconclusive"), ((-2.0, 0.5), "inconclusive"), ((-0.5, 2.0), "inconclusive"),
])
def test_a_lead_verdict_is_earlier_or_later_only_where_the_interval_leaves_out_zero(ci, verdict):
    assert det.lead_verdict(ci) == verdict


# ---- the break rule and the detectors' signals at their edges, from their definitions -------------------


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


Lead = namedtuple("Lead", "seed lead")


def test_the_bootstrap_interval_is_the_2_5th_and_97_5th_percentiles_of_1000_seed_resamples_by_hand():
    rng = random.Random(5)
    items = [Lead(seed, 100 - rng.randrange(1, 90)) for seed in range(30)]  # one run a seed

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
