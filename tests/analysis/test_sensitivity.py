"""analysis.sensitivity against hand calculations on made-up curves (docs/lr-study.md's definitions)."""

import math

import pytest

from attnscale.analysis import sensitivity as sv

FLOOR = 2.0


def _row(lr, seed, loss, treatment="none", learned=True, broke=None, optimizer="adamw", d_model=64):
    return {"optimizer": optimizer, "d_model": d_model, "lr": lr, "seed": seed, "treatment": treatment,
            "valid_loss": loss, "outcome": {"learned_at": 10 if learned else None, "break_step": broke}}


def _curve_rows(table, treatment="none"):
    return [_row(lr, s, loss, treatment) for s, losses in table.items() for lr, loss in losses.items()]


# seed -> {lr: loss}; seed 1's 0.04 run diverged (None), seed 0's 0.04 run is above the floor
TABLE = {0: {0.01: 1.60, 0.02: 1.55, 0.04: 2.50},
         1: {0.01: 1.62, 0.02: 1.58, 0.04: None},
         2: {0.01: 1.58, 0.02: 1.57, 0.04: 1.90}}


def test_curve_by_hand():
    c = sv.curve(_curve_rows(TABLE), FLOOR)
    # capped: seed 0 (1.60, 1.55, 2.0), seed 1 (1.62, 1.58, 2.0), seed 2 (1.58, 1.57, 1.90)
    best = [1.55, 1.58, 1.57]
    assert c["best_by_seed"] == {0: 1.55, 1: 1.58, 2: 1.57}
    assert c["best"]["mean"] == pytest.approx(sum(best) / 3)
    sens = [(1.60 + 1.55 + 2.0) / 3 - 1.55, (1.62 + 1.58 + 2.0) / 3 - 1.58, (1.58 + 1.57 + 1.90) / 3 - 1.57]
    assert [c["sensitivity_by_seed"][s] for s in range(3)] == pytest.approx(sens)
    m = sum(sens) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in sens) / 2)
    lo, hi = c["sensitivity"]["interval"]
    assert lo == pytest.approx(m - 4.302653 * sd / math.sqrt(3), abs=1e-6)
    assert hi == pytest.approx(m + 4.302653 * sd / math.sqrt(3), abs=1e-6)
    # seed means: 0.01 -> 1.60, 0.02 -> 1.5667, 0.04 -> 1.9667: best 0.02, within 0.05: 0.01 and 0.02
    assert c["best_lr"] == 0.02
    assert c["stable"]["lrs"] == [0.01, 0.02] and c["stable"]["ratio"] == pytest.approx(2.0)
    at = {p["lr"]: p for p in c["per_rate"]}
    assert at[0.04]["diverged"] == 1 and at[0.04]["losses"] == {0: 2.50, 1: None, 2: 1.90}


def test_curve_counts_breaks_and_never_learned_per_rate():
    rows = [_row(0.01, 0, 1.6), _row(0.01, 1, 1.7, broke=900), _row(0.01, 2, 2.3, learned=False)]
    p = sv.curve(rows, FLOOR)["per_rate"][0]
    assert (p["mid_run_breaks"], p["never_learned"], p["runs"]) == (1, 1, 3)


def test_a_seed_missing_a_rate_is_left_out():
    rows = _curve_rows(TABLE)
    rows = [r for r in rows if not (r["seed"] == 2 and r["lr"] == 0.04)]
    assert sv.curve(rows, FLOOR)["seeds"] == [0, 1]


def test_compare_is_paired_by_seed():
    other = {s: {lr: v - 0.1 if v is not None else None for lr, v in losses.items()} for s, losses in TABLE.items()}
    a, b = sv.curve(_curve_rows(TABLE), FLOOR), sv.curve(_curve_rows(other, "qk-norm"), FLOOR)
    got = sv.compare(b, a)["best"]
    assert got["diff"] == pytest.approx(-0.1) and got["reading"] == "lower"  # every seed 0.1 lower: SE 0


def test_judge_groups_and_equivalence():
    clip = _curve_rows(TABLE, "clip")
    alarm = [{**r, "treatment": "alarm-clip", "valid_loss": None if r["valid_loss"] is None else r["valid_loss"] + 0.001 * (r["seed"] + 1)}
             for r in clip]
    out = sv.judge(_curve_rows(TABLE) + clip + alarm + [_row(0.01, 0, 1.5, optimizer="muon")], FLOOR)
    assert [(g["optimizer"], g["d_model"]) for g in out["groups"]] == [("adamw", 64), ("muon", 64)]
    g = out["groups"][0]
    assert set(g["against"]["clip"]) == {"none"}
    assert g["alarm_clip_vs_clip"]["verdict"] == "equivalent"  # 0.001, 0.002, 0.003 nats apart
    assert g["alarm_clip_vs_clip"]["diff"] == pytest.approx(0.002)


@pytest.mark.parametrize("floor", [float("nan"), None, float("inf"), "2"])
def test_curve_refuses_a_floor_that_is_no_loss(floor):
    with pytest.raises(ValueError, match="floor"):
        sv.curve(_curve_rows(TABLE), floor)


def test_a_treatment_missing_a_rate_of_its_group_has_no_whole_seed():
    """alarm-clip's runs at the rates where the none run alarmed come after the block's others: until they have
    trained, its curve is read on no seed rather than on a grid cut short."""
    rows = _curve_rows(TABLE) + [r for r in _curve_rows(TABLE, "alarm-clip") if r["lr"] != 0.04]
    g = sv.judge(rows, FLOOR)["groups"][0]
    assert g["curves"]["none"]["seeds"] == [0, 1, 2] and g["curves"]["alarm-clip"]["seeds"] == []
    assert g["curves"]["alarm-clip"]["best"]["mean"] is None
