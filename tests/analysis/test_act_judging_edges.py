"""The act study's judging where a surviving mutant sat (docs/mutation.md, the judging part): each edge that a
published number goes through, checked against a count or a sum made here."""

import math

import pytest

from attnscale.analysis import act_judging as aj


def _row(cell, arm, seed, broke, valid):
    # learns at step 36 (17 losses of 1.7 and 3 of 3.0 in the 20-step window: 1.895, under 1.9318), and with
    # ``broke`` jumps by 1 nat at step 150 for good
    losses = [3.0] * 20 + [1.7] * 130 + [2.7 if broke else 1.7] * 150
    r = {"run_id": f"study-{cell}-{arm}-seed{seed}", "cell": cell, "arm": arm, "seed": seed, "losses": losses,
         "probes": [], "valid_loss": valid, "alarm_step": None, "action_steps": []}
    r["outcome"] = aj.outcome_of(r)
    return r


def test_a_pair_where_both_broke_is_no_discordant_pair():
    # (arm, A) broke: both, both, the arm alone, A alone, neither
    rows = [_row("z0", arm, seed, broke, 2.0)
            for seed, pair in enumerate([(1, 1), (1, 1), (1, 0), (0, 1), (0, 0)]) for arm, broke in zip("CA", pair)]
    got = aj.paired_breaks(rows, "C")
    assert (got["b"], got["c"], got["arm_breaks"], got["baseline_breaks"], got["pairs"]) == (1, 1, 3, 3, 5)
    assert got["p"] == 1.0  # one each way: 2 · P(Bin(2, ½) ≤ 1) = 2 · 3/4, capped at 1


def _losses(arm_losses, ref_losses):
    return [r for seed, (x, e) in enumerate(zip(arm_losses, ref_losses))
            for r in (_row("z0", "C", seed, False, x), _row("z0", "E", seed, False, e))]


@pytest.mark.parametrize("arm, ref, reading", [
    ([1.5, 1.75], [1.25, 1.5], "higher"),  # every pair 0.25 above: SE 0, the interval (0.25, 0.25)
    ([1.25, 1.5], [1.5, 1.75], "lower"),
    ([1.5, 1.5], [1.5, 1.5], "inconclusive"),  # every pair alike at 0: no sign
    ([1.9, 2.0, 2.1], [1.0, 1.0, 1.0], "higher"),  # 0.9, 1.0, 1.1: the interval 1 ± 0.248, above 0
    ([1.0, 1.0, 1.0], [1.9, 2.0, 2.1], "lower"),
    ([1.9, 2.0, 2.1], [1.8, 1.8, 1.8], "inconclusive"),  # 0.2 ± 0.248 holds 0
    ([1.9], [1.8], "inconclusive"),  # one pair: no interval
])
def test_the_reading_of_a_paired_loss(arm, ref, reading):
    test = aj.paired_loss(_losses(arm, ref), "C", "E")
    diffs = [x - e for x, e in zip(arm, ref)]
    assert test["diff"] == pytest.approx(math.fsum(diffs) / len(diffs)) and test["n"] == len(diffs)
    assert test["reading"] == reading


def test_attention_share_where_there_is_nothing_to_share():
    test = {"diff": 0.1, "interval": (0.05, 0.15)}
    got = aj.attention_share(test, [1.75, float("nan"), None, 1.25], floor=2.0)  # not finite: left out
    assert got == {"share": 0.1 / 0.5, "interval": (0.05 / 0.5, 0.15 / 0.5), "worth": 0.5}
    assert aj.attention_share({"diff": None, "interval": None}, [1.5], floor=2.0) is None  # no difference
    assert aj.attention_share(test, [float("nan"), None], floor=2.0) is None  # no finite reference loss
    assert aj.attention_share(test, [2.0, 2.0], floor=2.0) is None  # attention worth exactly nothing
    assert aj.attention_share({"diff": 0.1, "interval": None}, [1.5], floor=2.0)["interval"] is None


def test_break_leg_at_the_level_itself_and_loss_leg_with_every_pair_alike():
    assert aj.break_leg({"b": 3, "c": 1, "p": 0.05}) == "unclear"  # p < alpha, strictly
    assert aj.break_leg({"b": 5, "c": 0, "p": aj.mcnemar_exact(5, 0)}) == "unclear"  # 0.0625
    assert aj.break_leg({"b": 6, "c": 0, "p": aj.mcnemar_exact(6, 0)}) == "fewer"  # 0.03125
    alike = {"diff": 0.01, "se": 0.0, "interval": None}
    assert aj.loss_leg({**alike, "n": 2}) == "within"  # two pairs alike: that one number, under the margin
    assert aj.loss_leg({**alike, "n": 1}) == "unclear"  # one pair says nothing of the spread
    assert aj.loss_leg({**alike, "diff": 0.06, "n": 2}) == "worse"


def _study(cells=("z0", "z1e-4"), seeds=range(6)):
    """A breaks in every pair of z0 and in seeds 0-2 of z1e-4; B, C and D never; E at 1.80, C 0.01 above."""
    rows = []
    for cell in cells:
        for seed in seeds:
            rows += [_row(cell, "A", seed, cell == "z0" or seed < 3, 2.5), _row(cell, "E", seed, False, 1.80)]
            rows += [_row(cell, arm, seed, False, 1.81) for arm in "BCD"]
    return rows


def test_judge_by_default_reads_every_arm_and_keeps_its_rules():
    got = aj.judge(_study(), floor=2.3)
    assert list(got["arms"]) == ["A", "B", "C", "D", "E"] and got["cells"] == ["z0", "z1e-4"]
    assert got["interim"] is True and (got["alpha"], got["margin"], got["floor"]) == (0.05, 0.05, 2.3)
    # per cell, each cell's own pairs: z0 6 discordant, z1e-4 3
    assert [got["per_cell"][c]["C"]["breaks_vs_A"]["b"] for c in ("z0", "z1e-4")] == [6, 3]
    assert got["per_cell"]["z1e-4"]["A"]["tally"]["mid_run_breaks"] == 3
    c = got["arms"]["C"]
    assert (c["breaks_vs_A"]["b"], c["breaks_vs_A"]["c"]) == (9, 0)
    assert c["breaks_vs_A"]["p"] == pytest.approx(2 / 2 ** 9)
    assert c["share_vs_E"]["worth"] == pytest.approx(2.3 - 1.80) and c["decision"] == "saves runs"


def test_interval_text_of_none_one_and_two_pairs():
    assert aj.interval_text({"diff": None, "se": None, "n": 0, "interval": None}) == "—"
    assert aj.interval_text({"diff": 0.1, "se": None, "n": 1, "interval": None}, " nats") == "+0.100 nats (n=1, no interval)"
    # two pairs 0.25 and 0.75 apart: SE 0.25, t(0.975, 1) = 12.706: two decimals at an SE of 0.25, never fewer
    test = aj.paired_loss(_losses([1.5, 2.0], [1.25, 1.25]), "C", "E")
    half = 12.706204736174707 * 0.25
    assert test["se"] == pytest.approx(0.25) and test["interval"] == pytest.approx((0.5 - half, 0.5 + half))
    assert aj.interval_text(test) == f"+0.50 [{0.5 - half:+.2f}, {0.5 + half:+.2f}]"


def test_p_text_at_its_edges():
    assert aj.p_text(None) == "—" and aj.p_text(0.001) == "0.001" and aj.p_text(0.000999) == "< 0.001"


def test_judge_of_one_arm_and_mcnemar_names_a_bad_count():
    got = aj.judge([r for r in _study() if r["arm"] == "A"], arms=("A",))
    assert list(got["arms"]) == ["A"] and got["arms"]["A"]["tally"] == {
        "runs": 12, "learned": 12, "mid_run_breaks": 9, "degraded": 12, "never_learned": 0}
    with pytest.raises(ValueError, match="^counts must be non-negative, got -1, 2$"):
        aj.mcnemar_exact(-1, 2)
