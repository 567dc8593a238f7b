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


def test_the_median_of_an_even_number_of_seeds_is_the_mean_of_the_middle_two():
    # four seeds a rate: 0.1 -> (1.0, 2.0, 3.0, 4.0) = 2.5, not 2.0 or 3.0; 0.3 -> (1.0, 2.0, 3.0, inf) = 2.5 too;
    # 0.03 -> (2.0, 2.4, inf, inf): (2.4 + inf) / 2 = inf, so two diverged seeds of four make a rate never best
    assert oc.arm_best({0.1: [4.0, 1.0, 3.0, 2.0]}) == 2.5
    assert oc.arm_best({0.3: [1.0, None, 3.0, 2.0], 0.03: [2.4, None, 2.0, NAN]}) == 2.5
    with pytest.raises(ConfigError):
        oc.arm_best({0.03: [2.4, None, 2.0, NAN]})


def test_a_minimum_at_the_very_step_the_run_learnt_is_the_one_a_rise_is_measured_from():
    # 20 threes, 11 ones: step 29's mean is 2.0 (not under the level 2), step 30's (9·3 + 11·1) / 20 = 1.9, so
    # the run learns at 30 and, the loss jumping to 9 at once, 1.9 stays its lowest mean. Step 31's mean is
    # 2.2 and step 32's 2.5 >= 1.9 + 0.5: the crossing is at 32 (from step 31's 2.2 it would be 33, at 2.8).
    # Every later mean is higher, so the hold (>= 2.2) needs steps 32…81 to exist: 82 steps. The last loss
    # within 0.1 of 1.9 is step 30's own: the break is at 31, the step after the run learnt.
    losses = [3.0] * 20 + [1.0] * 11 + [9.0] * 51
    assert oc.learned_at(losses, 2.0) == 30
    assert oc.mid_run_break(losses, 2.0) == oc.Break(31, "rise")
    # one step shorter, the hold is cut short by the end (and measured from 2.2, 82 steps would be one too few)
    assert oc.mid_run_break(losses[:-1], 2.0) is None
    assert oc.classify(losses, None, 2.0, 2.5, 1.0).kind == "mid-run break"


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


# ---- the first round's rule (withdrawn), kept to draw that round again ------------------------------------

# 40 steps, ten of each level: median 1.15, MAD 0.1, robust SD 0.14826; 6 SDs above the median: 2.03956
ALT = [1.0, 1.1, 1.2, 1.3] * 10


def _series(losses, final=1.0):
    return list(losses), final


def _break(series, floor, rule=oc.FirstRoundRule()):
    losses, final = series
    return oc.first_round_break(losses, final, floor, rule)


def test_a_non_finite_loss_breaks_the_run_at_its_step():
    assert _break(_series([1.0] * 30 + [None], final=None), floor=None) == oc.Break(30, "non-finite")
    assert _break(_series([1.0] * 30 + [math.inf], final=None), floor=None) == oc.Break(30, "non-finite")


def test_a_spike_that_stays_up_breaks_the_run_where_it_starts():
    # steps 40 … 69 at 3.0, above 2.03956; none of the next 20 comes back under the line
    assert _break(_series(ALT + [3.0] * 30), floor=None) == oc.Break(40, "spike")


def test_a_spike_back_under_the_line_at_the_twentieth_step_after_is_no_break():
    # up at steps 40 … 59, back at 60: within steps 41 … 60, the 20 after step 40 (and within reach of
    # every later step of the jump)
    losses = ALT + [3.0] * 20 + ALT
    assert _break(_series(losses), floor=None) is None
    # allowed 19 steps, the same jump is a break at 40
    assert _break(_series(losses), floor=None, rule=oc.FirstRoundRule(recover=19)) == oc.Break(40, "spike")
    # one step longer (back at 61) breaks under the default 20
    assert _break(_series(ALT + [3.0] * 21 + ALT), floor=None) == oc.Break(40, "spike")


def test_a_jump_under_the_line_is_no_spike():
    # 2.03 < 2.03956 (6 robust SDs over the median 1.15)
    assert _break(_series(ALT + [2.03] * 40), floor=None) is None
    # 2.05 > 2.03956
    assert _break(_series(ALT + [2.05] * 40), floor=None) == oc.Break(40, "spike")
    # a 5-SD rule draws the line at 1.15 + 5 × 0.14826 = 1.8913
    assert _break(_series(ALT + [1.95] * 40), floor=None, rule=oc.FirstRoundRule(sigmas=5)) == oc.Break(40, "spike")
    assert _break(_series(ALT + [1.95] * 40), floor=None) is None


def test_a_spike_in_the_last_recover_steps_is_not_judged():
    # the jump at step 50 has 9 steps after it, fewer than the 20 its recovery needs
    assert _break(_series(ALT + ALT[:10] + [5.0] * 10), floor=None) is None


def test_a_spike_before_min_history_is_not_judged():
    losses = ALT[:10] + [3.0] * 60  # the jump at step 10; the first step judged is 20, seeing 10 values of 3
    # at step 20: history 10 cycle values + 10 × 3.0 → median (1.3 + 3.0) / 2 = 2.15, and 3.0 is under its line
    assert _break(_series(losses), floor=None) is None


def test_the_floor_breaks_a_run_from_the_last_window_under_it():
    no_spikes = oc.FirstRoundRule(sigmas=1e9, plateau=0)
    # 10 × 4.0, 30 × 2.0, 30 × 4.0: the 20-step mean ending at step i ≥ 40 holds i − 39 values of 4.0 and is
    # under 3.0 while i − 39 < 10, last at i = 48; the break is the next window's end, step 49
    losses = [4.0] * 10 + [2.0] * 30 + [4.0] * 30
    assert _break(_series(losses, final=3.5), floor=3.0, rule=no_spikes) == oc.Break(49, "floor")
    # held-out loss under the floor: healthy, whatever training did
    assert _break(_series(losses, final=2.9), floor=3.0, rule=no_spikes) is None
    # exactly at the floor is not above it
    assert _break(_series(losses, final=3.0), floor=3.0, rule=no_spikes) is None
    # without the spike switch off, the jump at step 40 (flat history: SD floored at 1e-3) comes first
    assert _break(_series(losses, final=3.5), floor=3.0, rule=oc.FirstRoundRule(plateau=0)) == oc.Break(40, "spike")


def test_the_plateau_margin_moves_the_line_under_the_unigram_loss():
    # floor 3.1, plateau 0.1: the line is 3.0; a held-out 3.05 is on the plateau, 2.95 is not
    rule = oc.FirstRoundRule(sigmas=1e9)
    losses = [4.0] * 10 + [2.0] * 30 + [4.0] * 30
    assert _break(_series(losses, final=3.05), floor=3.1, rule=rule) == oc.Break(49, "floor")
    assert _break(_series(losses, final=2.95), floor=3.1, rule=rule) is None
    # the windows' means are held to the same line: the mean ending at i ≥ 40 is 2 + (i − 39) / 10, so a line
    # at 2.5 (floor 2.6) is under the mean once i − 39 ≥ 5: the last window under it ends at 43, the break at 44
    assert _break(_series(losses, final=3.05), floor=2.6, rule=rule) == oc.Break(44, "floor")


def test_a_run_never_under_the_floor_is_broken_at_its_first_full_window():
    assert _break(_series([4.0] * 50, final=3.5), floor=3.0) == oc.Break(19, "floor")
    assert _break(_series([4.0] * 50, final=2.95), floor=3.0) == oc.Break(19, "floor")  # within 0.1


def test_a_run_whose_training_loss_ends_under_the_floor_breaks_at_its_last_step():
    assert _break(_series([2.0] * 50, final=3.5), floor=3.0) == oc.Break(49, "floor")
    assert _break(_series([2.0] * 50, final=2.85), floor=3.0) is None  # 0.15 under: off the plateau


def test_no_floor_rule_without_a_floor_or_a_held_out_loss():
    assert _break(_series([4.0] * 50, final=3.5), floor=None) is None
    assert _break(_series([4.0] * 50, final=None), floor=3.0) is None


def test_a_loss_exactly_on_the_spike_line_is_no_spike():
    """'More than six robust SDs above the median': a flat history (MAD 0, the SD floored at 1e-3) draws the
    line at 1 + 6e-3; a loss exactly on it neither starts a spike nor keeps one going."""
    line = 1.0 + 6.0 * 1e-3
    at_line_then_up = [1.0] * 50 + [line] + [2.0] * 30
    assert _break(_series(at_line_then_up, final=None), None) == oc.Break(51, "spike")  # not at 50
    up_then_at_line = [1.0] * 50 + [2.0] + [line] * 30
    assert _break(_series(up_then_at_line, final=None), None) is None  # it never stays above


def test_a_spike_must_hold_from_the_very_next_step():
    back_for_one = [1.0] * 50 + [2.0, 1.0] + [2.0] * 30
    # step 50 comes back under the line at 51: no spike there; from 52 on it holds (the one 2.0 before is
    # no more than one in fifty, so the median and MAD of the history are still 1 and 0)
    assert _break(_series(back_for_one, final=None), None) == oc.Break(52, "spike")


def test_a_loss_that_is_not_finite_ends_the_search_for_a_spike_there():
    """Nothing after the first non-finite loss is read: the run broke there."""
    losses = [1.0] * 30 + [None] + [1.0] * 40
    assert _break(_series(losses, final=None), None) == oc.Break(30, "non-finite")
