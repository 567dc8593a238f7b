"""The act study's judging at its edges, on hand-made runs, each number checked against a calculation made here."""

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from attnscale.analysis import act_judging as aj


def _binom_two_sided(b, c):
    """McNemar's exact p by enumerating every outcome at least as extreme (Fractions, no shortcut): the
    outcomes k of Bin(n, 1/2) whose probability is at most that of the one seen."""
    n = b + c
    probs = [Fraction(math.comb(n, k), 2 ** n) for k in range(n + 1)]
    seen = probs[b]
    return float(min(Fraction(1), sum(p for p in probs if p <= seen)))


@pytest.mark.parametrize("b,c,p", [(6, 0, 2 / 64), (5, 0, 2 / 32), (7, 1, 2 * 9 / 256), (10, 2, 2 * 79 / 4096),
                                   (3, 3, 1.0), (0, 0, 1.0), (0, 4, 2 / 16)])
def test_mcnemar_exact_by_hand(b, c, p):
    # by hand: 2 · (C(n,0) + … + C(n,min)) / 2^n, e.g. 10 vs 2: C(12,0)+C(12,1)+C(12,2) = 1+12+66 = 79
    assert aj.mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert aj.mcnemar_exact(b, c) == pytest.approx(_binom_two_sided(b, c), rel=1e-12)


def test_mcnemar_symmetric_and_six_needed_for_five_percent():
    for b in range(12):
        for c in range(12):
            assert aj.mcnemar_exact(b, c) == aj.mcnemar_exact(c, b)
    # the rule's remark: fewer than 6 discordant pairs one way with none the other cannot reach p < 0.05
    assert aj.mcnemar_exact(5, 0) >= 0.05 > aj.mcnemar_exact(6, 0)
    with pytest.raises(ValueError):
        aj.mcnemar_exact(-1, 2)


def _row(cell, arm, seed, losses, valid):
    r = {"run_id": f"study-{cell}-{arm}-seed{seed}", "cell": cell, "arm": arm, "seed": seed, "losses": losses,
         "probes": [], "valid_loss": valid, "alarm_step": None, "action_steps": []}
    r["outcome"] = aj.outcome_of(r)
    return r


LEVEL = aj.LEARNED_LEVEL


def _held(n=300):
    return [3.0] * 20 + [1.7] * (n - 20)


def _broken(n=300, at=150):
    # learns at step 36 (17 losses of 1.7 and 3 of 3.0: a mean of 1.895, under 1.9318; 16 give 1.96), then
    # jumps by 1 nat at ``at`` for good
    return [3.0] * 20 + [1.7] * (at - 20) + [2.7] * (n - at)


def test_outcome_of_reads_the_warning_studys_rules():
    held, broke, never = _row("z0", "A", 0, _held(), 1.8), _row("z0", "A", 1, _broken(), 2.6), \
        _row("z0", "A", 2, [3.0] * 300, 3.0)
    assert held["outcome"]["learned_at"] == 36 and held["outcome"]["break_step"] is None
    assert broke["outcome"]["break_step"] == 150 and broke["outcome"]["break_reason"] == "rise"
    assert never["outcome"]["learned_at"] is None and never["outcome"]["kind"] == "never learned"
    # degraded: above the floor, or over 0.1 nats above the arm's best (qk-norm off, z0: 1.5933)
    assert not _row("z0", "A", 3, _held(), 1.6932)["outcome"]["degraded"]
    assert _row("z0", "A", 3, _held(), 1.6934)["outcome"]["degraded"]
    assert _row("z0", "E", 3, _held(), 1.7184)["outcome"]["degraded"] is False  # E's own best: 1.6185
    assert _row("z0", "A", 3, _held(), None)["outcome"]["degraded"]  # diverged
    assert aj.tally([held, broke, never]) == {"runs": 3, "learned": 2, "mid_run_breaks": 1, "degraded": 3,
                                              "never_learned": 1}


def test_the_warning_studys_numbers_are_its_json():
    # independent of the module: the committed study's own file
    recipe = json.loads((Path(__file__).parents[2] / "docs" / "warn-study.json").read_text())["recipe"]
    assert aj.FLOOR == recipe["pilot"]["floor"] and aj.LEARNED_LEVEL == recipe["pilot"]["level"]
    for (cell, qk_norm), best in aj.BEST_OF_ARM.items():
        arm = ("qk-on-" if qk_norm else "qk-off-") + cell
        assert best == recipe["arms"][arm]["best_valid_loss"]


def _pairs(arm_broke, a_broke, arm="C", cells=("z0",)):
    rows = []
    for cell in cells:
        for seed, (x, a) in enumerate(zip(arm_broke, a_broke)):
            rows.append(_row(cell, "A", seed, _broken() if a else _held(), 2.0))
            rows.append(_row(cell, arm, seed, _broken() if x else _held(), 1.8))
    return rows


def test_paired_breaks_count_discordant_pairs_per_cell_and_seed():
    rows = _pairs([0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0], cells=("z0", "z1e-4"))
    got = aj.paired_breaks(rows, "C")
    # per cell: A broke and C held at seeds 0, 1, 2 (b = 3); C broke and A held at seed 4 (c = 1); two cells
    assert (got["pairs"], got["b"], got["c"], got["baseline_breaks"], got["arm_breaks"]) == (12, 6, 2, 8, 4)
    assert got["p"] == pytest.approx(2 * (1 + 8 + 28) / 256)


def _loss_rows(arm_losses, ref_losses, arm="C", ref="E"):
    rows = []
    for seed, (x, e) in enumerate(zip(arm_losses, ref_losses)):
        rows += [_row("z0", arm, seed, _held(), x), _row("z0", ref, seed, _held(), e)]
    return rows


def test_paired_loss_t_interval_at_small_n():
    # differences 0.1, 0.2, 0.3: mean 0.2, SD 0.1, SE 0.1/sqrt(3); t(0.975, 2) = 4.302652729749464 (tables)
    test = aj.paired_loss(_loss_rows([1.9, 2.0, 2.1], [1.8, 1.8, 1.8]), "C", "E")
    half = 4.302652729749464 * 0.1 / math.sqrt(3)
    assert test["diff"] == pytest.approx(0.2) and test["n"] == 3
    assert test["interval"] == pytest.approx((0.2 - half, 0.2 + half))
    assert test["reading"] == "inconclusive"  # 0.2 - 0.248 < 0 < the upper end
    assert aj.loss_leg(test) == "unclear"  # the lower end under the 0.05 margin, the upper above it


def test_paired_loss_leaves_out_a_diverged_pair_and_says_so():
    test = aj.paired_loss(_loss_rows([1.9, None, 2.0, 2.1], [1.8, 1.8, 1.8, float("nan")]), "C", "E")
    assert test["n"] == 2 and test["left_out"] == 2 and test["diff"] == pytest.approx(0.15)


def test_loss_leg_edges():
    def leg(lo, hi, n=4):
        return aj.loss_leg({"diff": (lo + hi) / 2, "se": 1.0, "n": n, "interval": (lo, hi)})

    assert leg(-0.1, 0.05) == "within"  # the margin itself is within
    assert leg(-0.1, 0.0501) == "unclear"
    assert leg(0.0501, 0.2) == "worse"
    assert leg(0.05, 0.2) == "unclear"  # a lower end at the margin is not above it
    assert aj.loss_leg({"diff": 0.01, "se": None, "n": 1, "interval": None}) == "unclear"
    assert aj.loss_leg({"diff": 0.01, "se": 0.0, "n": 3, "interval": None}) == "within"


def test_decide_each_verdict():
    within = {"diff": 0.0, "se": 0.01, "n": 8, "interval": (-0.02, 0.02)}
    worse = {"diff": 0.3, "se": 0.01, "n": 8, "interval": (0.2, 0.4)}
    unclear = {"diff": 0.05, "se": 0.01, "n": 8, "interval": (0.0, 0.1)}
    fewer = {"b": 6, "c": 0, "p": aj.mcnemar_exact(6, 0)}
    weak = {"b": 5, "c": 0, "p": aj.mcnemar_exact(5, 0)}
    tie = {"b": 2, "c": 2, "p": 1.0}
    assert aj.decide(fewer, within) == "saves runs"
    assert aj.decide(fewer, worse) == "saves runs at a loss cost"
    assert aj.decide(fewer, unclear) == "inconclusive"
    assert aj.decide(weak, within) == "inconclusive"  # fewer, but p = 0.0625
    assert aj.decide(tie, within) == "does not save runs"
    assert aj.decide({"b": 0, "c": 3, "p": 0.25}, within) == "does not save runs"


def test_attention_share_divides_by_what_attention_is_worth():
    test = {"diff": 0.1, "interval": (0.05, 0.15)}
    got = aj.attention_share(test, [1.7666, 1.7664], floor=2.2665)
    worth = 2.2665 - 1.7665
    assert got["share"] == pytest.approx(0.1 / worth) and got["interval"] == pytest.approx((0.05 / worth, 0.15 / worth))
    assert aj.attention_share(test, [2.5], floor=2.2665) is None  # no worth to share


def test_judge_reads_whole_seeds_only_and_decides():
    rows = []
    for seed in range(6):  # A breaks in every pair, C never; E and C at the same loss
        for cell in ("z0", "z1e-4"):
            rows += [_row(cell, "A", seed, _broken(), 2.5), _row(cell, "C", seed, _held(), 1.80 + 0.001 * seed),
                     _row(cell, "E", seed, _held(), 1.80)]
    rows.append(_row("z0", "A", 6, _broken(), 2.5))  # seed 6 unfinished: not read
    got = aj.judge(rows, arms=("A", "C", "E"))
    assert got["seeds"] == [0, 1, 2, 3, 4, 5]
    c = got["arms"]["C"]
    assert (c["breaks_vs_A"]["b"], c["breaks_vs_A"]["c"]) == (12, 0)
    assert c["breaks_vs_A"]["p"] == pytest.approx(2 / 4096)
    assert c["decision"] == "saves runs"
    assert got["per_cell"]["z0"]["C"]["breaks_vs_A"]["b"] == 6
    assert got["arms"]["A"]["tally"]["mid_run_breaks"] == 12


def test_interval_text_never_prints_zero_width():
    assert aj.interval_text({"diff": 0.2, "se": 0.0, "n": 3, "interval": None}) == "+0.200 (every pair alike)"
    text = aj.interval_text({"diff": 0.00123, "se": 0.0004, "n": 8, "interval": (0.00028, 0.00218)})
    assert text == "+0.00123 [+0.00028, +0.00218]"
    assert "0.00 " not in text and aj.p_text(0.03125) == "0.0312" and aj.p_text(0.0002) == "< 0.001"
