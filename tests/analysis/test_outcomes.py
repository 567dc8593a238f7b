"""analysis/outcomes: each rule pinned by hand-made loss series at its edges; every expected step and
level is worked out by hand in the comments (dyadic losses, so the float sums are exact)."""

import math

import pytest

from attnscale.analysis import outcomes as oc
from attnscale.errors import ConfigError

NAN = float("nan")
LEARNT = [3.0] * 20 + [1.0] * 60  # learns at step 30 (level 2); the 20-step mean sits at 1.0 from step 39


def test_the_window_mean_starts_at_a_full_window_and_stops_at_a_non_finite_loss():
    assert oc.window_means([1.0, 2.0, 3.0, 4.0, None, 1.0], window=2) == [None, 1.5, 2.5, 3.5, None, None]


def test_learned_is_the_first_window_strictly_under_the_level():
    # step 39: 10 threes and 10 ones = 2.0, not under 2; step 40: (9·3 + 11·1) / 20 = 1.9
    assert oc.learned_at([3.0] * 30 + [1.0] * 40, 2.0) == 40
    assert oc.learned_at([3.0] * 30 + [1.0] * 9, 2.0) is None  # the series ends at step 38
    assert oc.learned_at([3.0] * 30 + [NAN] + [1.0] * 40, 2.0) is None  # blew up before it learnt


def test_a_rise_of_exactly_half_a_nat_held_fifty_steps_is_a_break_and_dates_from_its_jump():
    # from step 80 the loss is 1.5: the mean is 1 + 0.5·n/20 with n steps of 1.5 in it, so it reaches
    # 1.5 = minimum + 0.5 at step 99; the hold needs means >= 1.3 at steps 99…148, i.e. losses of 1.5
    # through step 148 (69 of them). The last loss within 0.1 of the minimum is step 79's: the break is 80.
    assert oc.mid_run_break(LEARNT + [1.5] * 69, 2.0) == oc.Break(80, "rise")
    assert oc.mid_run_break(LEARNT + [1.5] * 68, 2.0) is None  # the series ends one step into the hold's 50th
    assert oc.mid_run_break(LEARNT + [1.49] * 200, 2.0) is None  # 0.49 above the minimum is not a break


def test_the_hold_needs_fifty_steps_not_forty_nine():
    # K steps of 2.0 from step 80, then 1.0 again: the mean is 1 + n/20 for n steps of 2.0 in the window.
    # It crosses 1.5 at n = 10 (step 89); after the block it keeps n = K + 99 − j >= 6 (mean >= 1.3)
    # up to step K + 93. The hold needs steps 89…138: K = 45 holds exactly 50 steps, K = 44 only 49.
    assert oc.mid_run_break(LEARNT + [2.0] * 45 + [1.0] * 100, 2.0) == oc.Break(80, "rise")
    assert oc.mid_run_break(LEARNT + [2.0] * 44 + [1.0] * 100, 2.0) is None


def test_a_spike_that_heals_is_no_break():
    # one loss of 12 at step 80 lifts the mean to 1 + 11/20 = 1.55 for 20 steps, then it is 1.0 again
    assert oc.mid_run_break(LEARNT + [12.0] + [1.0] * 100, 2.0) is None


def test_a_non_finite_loss_after_learning_breaks_there_and_before_learning_is_never_learned():
    assert oc.mid_run_break(LEARNT + [1.0] * 10 + [NAN], 2.0) == oc.Break(90, "non-finite")
    assert oc.mid_run_break(LEARNT + [1.0] * 10 + [None], 2.0) == oc.Break(90, "non-finite")
    early = [3.0] * 25 + [math.inf]
    assert oc.mid_run_break(early, 2.0) is None
    assert oc.classify(early, None, 2.0, 2.5, 1.0).kind == "never learned"


def test_a_rise_cut_short_by_a_non_finite_loss_dates_from_where_it_began():
    # 1.5 from step 80, crossing at 99 (as above), NaN at step 110, inside the hold: the run blew up mid-rise
    assert oc.mid_run_break(LEARNT + [1.5] * 30 + [NAN], 2.0) == oc.Break(80, "rise")


def test_a_slow_divergence_counts_and_dates_from_where_the_loss_left_the_minimum():
    # from step 80 the loss is 1 + (k + 1)/32 at step 80 + k. For k >= 19 the window holds k − 18 … k + 1,
    # mean 1 + (k − 8.5)/32, >= 1.5 from k = 25 (step 105), and it keeps rising through the hold (to 154).
    # Losses within 0.1 of the minimum: (k + 1)/32 <= 0.1, k <= 2 (step 82): the break is step 83.
    slow = LEARNT + [1 + (k + 1) / 32 for k in range(100)]
    assert oc.mid_run_break(slow, 2.0) == oc.Break(83, "rise")
    assert oc.classify(slow, 3.5, 2.0, 2.5, 1.0).kind == "mid-run break"


def test_a_run_that_learnt_and_held_is_neither_broken_nor_never_learned():
    o = oc.classify(LEARNT + [1.0] * 100, 1.05, 2.0, 2.5, 1.0)
    assert (o.learned_at, o.broke, o.degraded, o.kind) == (30, None, False, "learned, held")


def test_degraded_is_above_the_floor_or_more_than_the_margin_above_the_arms_best():
    assert oc.degraded(2.5, floor=2.25, best_of_arm=1.5, margin=0.25)  # above the no-attention floor
    assert oc.degraded(1.875, floor=2.25, best_of_arm=1.5, margin=0.25)  # 0.375 above the best rate
    assert not oc.degraded(1.75, floor=2.25, best_of_arm=1.5, margin=0.25)  # exactly the margin: not more
    assert oc.degraded(None, 2.25, 1.5) and oc.degraded(NAN, 2.25, 1.5)  # diverged


def test_the_arms_best_is_the_lowest_median_with_a_diverged_run_as_infinite():
    # medians: 0.1 -> sorted (2.0, 2.2, inf) = 2.2; 0.3 -> (1.9, inf, inf) = inf; 0.03 -> (2.4, 2.6) = 2.5
    assert oc.arm_best({0.1: [2.0, 2.2, None], 0.3: [1.9, None, NAN], 0.03: [2.6, 2.4]}) == pytest.approx(2.2)
    with pytest.raises(ConfigError, match="no learning rate of the arm has a finite median"):
        oc.arm_best({0.3: [None, 1.0, None]})


def test_the_learned_level_lies_between_the_floor_and_the_best_run():
    assert oc.learned_level(2.32, 1.52) == pytest.approx(2.32 - 0.5 * 0.8)
    assert oc.learned_level(2.0, 1.0, share=0.25) == pytest.approx(1.75)
    with pytest.raises(ConfigError, match="must be below the no-attention floor"):
        oc.learned_level(2.0, 2.1)
    assert oc.no_attention_floor(2.32) == 2.32 and oc.no_attention_floor(2.32, 2.4) == 2.32
    assert oc.no_attention_floor(2.32, 2.2) == 2.2


def test_the_bigram_loss_by_hand():
    # train 0 1 0 1 1: pairs (0,1)×2, (1,0)×1, (1,1)×1; predecessors 0: 2, 1: 2; V = 2
    # held out 0 1 1: p(1|0) = (2+1)/(2+2), p(1|1) = (1+1)/(2+2)
    want = -(math.log(3 / 4) + math.log(2 / 4)) / 2
    assert oc.bigram_loss([0, 1, 0, 1, 1], [0, 1, 1], 2) == pytest.approx(want, rel=1e-15)
    with pytest.raises(ConfigError, match="at least two tokens"):
        oc.bigram_loss([0, 1], [0], 2)


def test_the_tally_keeps_never_learned_apart_from_breaks():
    runs = [oc.RunOutcome(None, None, True), oc.RunOutcome(30, oc.Break(80, "rise"), True),
            oc.RunOutcome(30, None, False), oc.RunOutcome(40, oc.Break(90, "non-finite"), True)]
    assert oc.tally(runs) == {"runs": 4, "learned": 3, "mid_run_breaks": 2, "degraded": 3, "never_learned": 1}
