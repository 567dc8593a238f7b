"""analysis.alarm_judging against hand counts on made-up runs (docs/alarm-study.md's rules)."""

import pytest

from attnscale.analysis import alarm_judging as aj


def _losses(broke_at=None, n=3000):
    """A run that learns (1.6 nats from step 200) and, with ``broke_at``, rises to 2.8 from that step."""
    out = [3.0] * 200 + [1.6] * (n - 200)
    if broke_at is not None:
        out[broke_at:] = [2.8] * (n - broke_at)
    return out


def _row(arm, seed, alarm=None, broke=None, learned=True, loss=1.6, lr=0.06):
    probes = [{"step": s, "max_score": 2e4 if alarm is not None and s >= alarm else 50.0} for s in range(0, 3000, 10)]
    return {"arm": arm, "seed": seed, "lr": lr, "probes": probes, "valid_loss": loss, "losses": _losses(broke),
            "outcome": {"learned_at": 200 if learned else None, "break_step": broke}}


def test_choose_rate_rule():
    def s(k, n):
        return {"k": k, "n": n, "share": k / n if n else None}

    assert aj.choose_rate({0.05: s(0, 8), 0.06: s(3, 8), 0.07: s(5, 8)}) == {"rate": 0.06, "add": None}
    assert aj.choose_rate({0.05: s(2, 8), 0.06: s(6, 8)})["rate"] == 0.05  # 25% and 75%: ties go to the lower rate
    none = aj.choose_rate({0.05: s(0, 8), 0.06: s(1, 8), 0.07: s(8, 8)})
    assert none["rate"] is None and none["add"] == pytest.approx((0.06 * 0.07) ** 0.5, rel=1e-2)
    assert aj.choose_rate({0.05: s(0, 8), 0.07: s(1, 8)})["add"] == pytest.approx((0.07 * 0.08) ** 0.5, rel=1e-2)


def test_the_pilot_adds_once_then_takes_the_rate_nearest_half():
    def s(k, n):
        return {"k": k, "n": n, "share": k / n if n else None}

    first = {0.05: s(0, 8), 0.06: s(7, 8), 0.07: s(8, 8)}  # the pilot's own three rates as they came out
    assert aj.choose_rate(first) == {"rate": None, "add": 0.0548}  # sqrt(0.05 * 0.06) = 0.05477
    assert aj.added_rate(first) is None
    # the added rate qualifies: it is taken like any other
    assert aj.choose_rate({**first, 0.0548: s(4, 8)}) == {"rate": 0.0548, "add": None}
    # it does not: no second addition (that would be sqrt(0.0548 * 0.06)), the rate nearest 50% instead;
    # 1/8 and 7/8 are both 0.375 from it, the tie goes to the lower rate
    after = aj.choose_rate({**first, 0.0548: s(1, 8)})
    assert after == {"rate": 0.0548, "add": None, "fallback": True, "added": 0.0548}
    assert aj.choose_rate({**first, 0.0548: s(0, 8)})["rate"] == 0.06  # 0/8 is 0.5 away, 7/8 0.375
    # a rate that is not the rule's addition does not stop it adding
    assert aj.added_rate({**first, 0.055: s(0, 8)}) is None
    assert aj.choose_rate({**first, 0.055: s(0, 8)})["add"] == pytest.approx((0.055 * 0.06) ** 0.5, rel=1e-2)


def test_pilot_shares_count_learned_runs_only():
    rows = [_row("A", 100, broke=1500), _row("A", 101), _row("A", 102, learned=False), _row("B", 103, broke=900)]
    got = aj.pilot_shares(rows)[0.06]
    assert (got["k"], got["n"], got["never_learned"]) == (1, 2, 1)


def test_sensitivity_false_alarms_and_separation_by_hand():
    rows = [_row("A", 0, alarm=1000, broke=1500),   # warned 500 steps ahead
            _row("A", 1, alarm=1450, broke=1500),   # 50 steps: too late
            _row("A", 2, alarm=None, broke=1500),   # never warned
            _row("A", 3, alarm=800),                # false alarm
            _row("A", 4), _row("A", 5), _row("A", 6, learned=False, alarm=100)]
    sens = aj.sensitivity(rows)
    assert (sens["study"]["k"], sens["study"]["n"]) == (1, 3)
    fa = aj.false_alarms(rows)
    assert (fa["k"], fa["n"], fa["seeds"]) == (1, 3, [3])
    assert not any(s["separates"] for s in aj.separation(rows))  # 3 breakers cannot give a lower end >= 0.8


def test_alarm_step_ignores_step_0():
    r = _row("A", 0)
    r["probes"][0]["max_score"] = 1e6
    assert aj.alarm_step(r) is None


def _study(c_delta=0.001, f_loss=1.55, e_loss=1.70, fa_share=1.0):
    rows = []
    for s in range(10):
        fired = s < 10 * fa_share
        rows += [_row("A", s, alarm=800 if fired else None, loss=1.60),
                 _row("B", s, loss=1.62 + 0.001 * s), _row("C", s, loss=1.62 + 0.001 * s + c_delta),
                 _row("E", s, loss=e_loss + 0.002 * (s % 3)), _row("F", s, loss=f_loss + 0.003 * (s % 2))]
    return rows


def test_decision_lower_the_rate():
    j = aj.judge(_study())
    assert j["F_vs_C"]["reading"] == "lower" and j["decision"] == "lower the rate"


def test_decision_clip_always_and_use_qk_norm():
    j = aj.judge(_study(f_loss=1.70))
    assert j["C_vs_B"]["verdict"] == "equivalent" and j["false_alarms"]["interval"][0] >= 0.5
    assert j["decision"] == "clip always"
    assert aj.judge(_study(f_loss=1.70, e_loss=1.50))["decision"] == "use qk-norm"


def test_false_alarm_cost_is_paired_over_the_seeds_it_fired_on():
    j = aj.judge(_study(fa_share=0.5))
    assert j["false_alarm_cost"]["n"] == 5
    # C − A on seeds 0–4: 1.62 + 0.001 s + 0.001 − 1.60
    assert j["false_alarm_cost"]["diff"] == pytest.approx(0.021 + 0.001 * 2)


def test_the_arms_summary_and_the_false_alarms_median_step_by_hand():
    """Per arm its runs, breaks, never-learned runs and mean final loss with a t interval (t(0.975, 2) = 4.303, by
    table); arm A's holders and breakers apart; the median step of the alarm among the holders it fired on."""
    rows = [_row("A", 0, alarm=1200, loss=2.0), _row("A", 1, alarm=1500, loss=2.2), _row("A", 2, loss=1.9),
            _row("A", 3, alarm=1300, broke=2000, loss=None), _row("A", 4, learned=False, loss=2.3),
            _row("F", 0, loss=1.5), _row("F", 1, loss=1.6), _row("F", 2, loss=1.7)]
    got = aj.arms(rows)
    assert got["A"]["runs"] == 5 and got["A"]["breaks"] == 1 and got["A"]["never_learned"] == 1
    assert got["F"]["loss"]["mean"] == pytest.approx(1.6) and got["F"]["loss"]["n"] == 3
    se = 0.1 / 3 ** 0.5  # sample SD of 1.5, 1.6, 1.7 is 0.1
    assert got["F"]["loss"]["se"] == pytest.approx(se)
    assert got["F"]["loss"]["interval"] == pytest.approx((1.6 - 4.302653 * se, 1.6 + 4.302653 * se), rel=1e-6)
    assert got["A holders"] == {"runs": 3, "loss": aj.mean_loss(rows[:3])}
    assert got["A holders"]["loss"]["mean"] == pytest.approx((2.0 + 2.2 + 1.9) / 3)
    assert got["A breakers"]["runs"] == 1 and got["A breakers"]["loss"] == {"mean": None, "se": None, "n": 0,
                                                                             "interval": None}
    fa = aj.false_alarms(rows)
    assert fa["seeds"] == [0, 1] and fa["median_step"] == (1200 + 1500) / 2
    assert aj.false_alarms(rows[2:3])["median_step"] is None
