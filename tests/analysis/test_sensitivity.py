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
    assert (p["mid_run_breaks"], p["never_learned"], p["runs"], p["failed_seeds"]) == (1, 1, 3, [1, 2])


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


def test_alarm_readings_count_by_hand():
    """The alarm in one group's none runs, per rate and over the grid: counted here from the probes directly."""
    def run(lr, seed, scores, learned=True, broke=None, treatment="none"):
        return {"treatment": treatment, "lr": lr, "seed": seed, "valid_loss": 1.6, "losses": [],  # dated by outcome
                "probes": [{"step": 10 * (i + 1), "max_score": s} for i, s in enumerate(scores)],
                "outcome": {"learned_at": 100 if learned else None, "break_step": broke}}

    rows = [run(1e-2, 0, [5.0, 50.0]), run(1e-2, 1, [5.0, 2e4]),  # held: one quiet, one false alarm at step 20
            run(4e-2, 0, [2e4, 3e4], broke=1000),  # broke, alarm at 10: 990 steps ahead
            run(4e-2, 1, [5.0, 5.0], broke=500),  # broke, no alarm
            run(4e-2, 2, [9e3, 2e4], broke=90),  # broke, alarm at 20, 70 steps ahead: under the 100-step lead
            run(8e-2, 0, [3e4], learned=False),  # never learned, fired: counted apart
            run(8e-2, 0, [3e4], treatment="clip")]  # another treatment: not read
    got = sv.alarm_readings(rows, 1e4)
    assert [(p["lr"], p["runs"], p["never_learned"], p["broke"], p["held"], p["fired_broke"], p["fired_held"],
             p["fired_never"]) for p in got["by_rate"]] == [
        (1e-2, 2, 0, 0, 2, 0, 1, 0), (4e-2, 3, 0, 3, 0, 2, 0, 0), (8e-2, 1, 1, 0, 0, 0, 0, 1)]
    fa = got["false_alarms"]
    assert (fa["k"], fa["n"], fa["median_step"]) == (1, 2, 20) and fa["share"] == 0.5
    lo, hi = fa["interval"]  # Wilson, 1 of 2: 0.5 -+ 1.96 * sqrt(0.25/2 + 1.96^2/16) / (1 + 1.96^2/2), by hand
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 2 + z * z / 16) / (1 + z * z / 2)
    assert (lo, hi) == pytest.approx((0.5 - half, 0.5 + half))
    sens = got["sensitivity"]["study"]
    assert (sens["k"], sens["n"]) == (1, 3)  # only the alarm 990 steps ahead counts
    ladder = {x["level"]: x for x in got["ladder"]}
    # at 100 the 9e3 run's alarm comes at step 10, 80 steps ahead of its break at 90: still under the lead
    assert (ladder[100.0]["sensitivity"]["study"]["k"], ladder[100.0]["false_alarms"]["k"]) == (1, 1)
    assert (ladder[3e4]["sensitivity"]["study"]["k"], ladder[3e4]["false_alarms"]["k"]) == (0, 0)
    assert ladder[1e4] == {"level": 1e4, "sensitivity": got["sensitivity"], "false_alarms": got["false_alarms"]}
    assert sv.alarm_readings([r for r in rows if r["treatment"] != "none"], 1e4)["by_rate"] == []
