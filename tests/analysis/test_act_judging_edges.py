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


T_975 = {2: 4.302652729749464, 3: 3.182446305284263}  # t(0.975, df), from tables
T_95 = {2: 2.919985580355516}  # t(0.95, df): the 90% interval of the equivalence test


def _seed_rows(arm_losses, ref_losses, arm="C", ref="E"):
    """Per seed, each cell's final loss of ``arm`` and of ``ref`` ({seed: {cell: loss}}); a cell missing is no run."""
    return [_row(cell, a, seed, False, v) for a, losses in ((arm, arm_losses), (ref, ref_losses))
            for seed, by_cell in losses.items() for cell, v in by_cell.items()]


def test_seed_loss_averages_each_seeds_cells_first_and_leaves_out_a_seed_without_every_cell():
    arm = {0: {"z0": 1.90, "z1e-4": 1.70}, 1: {"z0": 2.00, "z1e-4": 1.80}, 2: {"z0": 2.30, "z1e-4": 1.90},
           3: {"z0": 1.0}, 4: {"z0": 2.0, "z1e-4": float("nan")}, 6: {"z0": 2.0, "z1e-4": 2.0}, 7: {"z0": 2.0}}
    ref = {0: {"z0": 1.80, "z1e-4": 1.60}, 1: {"z0": 1.80, "z1e-4": 1.70}, 2: {"z0": 1.80, "z1e-4": 1.70},
           3: {"z0": 1.5, "z1e-4": 1.5}, 4: {"z0": 1.8, "z1e-4": 1.8}, 5: {"z0": 1.8, "z1e-4": 1.8}, 6: {"z0": 1.8},
           7: {"z0": 1.8}}
    # seed 3 lacks z1e-4 in C and seed 6 in E: not pairs; seed 4 diverged: a pair left out; seed 5 is not in C;
    # seed 7 ran one cell in both arms: a pair of that one cell. Another arm's run is no run of either (seed 6)
    got = aj.seed_loss(_seed_rows(arm, ref) + [_row("z1e-4", "A", 6, False, 1.8)], "C", "E")
    diffs = [(1.90 + 1.70) / 2 - (1.80 + 1.60) / 2, (2.00 + 1.80) / 2 - (1.80 + 1.70) / 2,
             (2.30 + 1.90) / 2 - (1.80 + 1.70) / 2, 2.0 - 1.8]  # 0.1, 0.15, 0.35, 0.2
    mean = math.fsum(diffs) / 4
    se = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / 3) / 2
    assert (got["n"], got["left_out"]) == (4, 1)
    assert got["diff"] == pytest.approx(mean) and got["se"] == pytest.approx(se)
    assert got["interval"] == pytest.approx((mean - T_975[3] * se, mean + T_975[3] * se))
    # the seed as the unit is not the pairs as the unit: 6 pairs of cells give another SE and interval
    cells = aj.paired_loss(_seed_rows({s: v for s, v in arm.items() if s < 3}, ref), "C", "E")
    assert cells["n"] == 6 and cells["se"] != pytest.approx(se)


def test_judge_adds_the_seed_as_the_unit_beside_each_paired_loss_and_c_against_b():
    rows = _study(seeds=range(4))
    for r in rows:  # C above B by 0.030, 0.031, 0.032, 0.033 in both cells: the difference beyond ±0.02
        if r["arm"] == "C":
            r["valid_loss"] = 1.81 + 0.030 + 0.001 * r["seed"]
    got = aj.judge(rows, floor=2.3)
    arms = got["arms"]
    assert "seed_loss_vs_A" not in arms["A"] and "seed_loss_vs_E" not in arms["E"]
    c = arms["C"]
    assert c["seed_loss_vs_E"]["n"] == 4 and c["seed_loss_vs_E"]["diff"] == pytest.approx(0.0415)
    assert c["seed_loss_vs_A"]["diff"] == pytest.approx(0.0415 + 1.80 - 2.5)
    assert arms["A"]["seed_loss_vs_E"]["diff"] == pytest.approx(2.5 - 1.80)
    assert arms["E"]["seed_loss_vs_A"]["diff"] == pytest.approx(1.80 - 2.5)
    cb = got["C_vs_B"]
    diffs = [0.030, 0.031, 0.032, 0.033]
    se = math.sqrt(math.fsum((d - 0.0315) ** 2 for d in diffs) / 3) / 2
    assert cb["margin"] == 0.02 and cb["n"] == 4 and cb["diff"] == pytest.approx(0.0315)
    assert cb["interval_95"] == pytest.approx((0.0315 - T_975[3] * se, 0.0315 + T_975[3] * se))
    assert cb["verdict"] == "different"  # the 95% interval excludes 0 and passes the margin
    only = aj.judge([r for r in rows if r["arm"] in "BC"], arms=("B", "C"))  # both arms and nothing else
    assert only["C_vs_B"]["diff"] == pytest.approx(0.0315) and "C_vs_B" not in aj.judge(rows, arms=("A", "C", "E"))


def test_c_against_b_within_the_margin_is_equivalent():
    rows = [r for r in _study(cells=("z0",), seeds=range(3)) if r["arm"] in "BC"]
    for r in rows:  # 0.005, 0.006, 0.007: the 90% interval 0.006 ± 2.92 · 0.001/√3, inside ±0.02
        if r["arm"] == "C":
            r["valid_loss"] = 1.81 + 0.005 + 0.001 * r["seed"]
    cb = aj.judge(rows, arms=("B", "C"))["C_vs_B"]
    half = T_95[2] * 0.001 / math.sqrt(3)
    assert cb["interval_90"] == pytest.approx((0.006 - half, 0.006 + half)) and cb["verdict"] == "equivalent"
