"""The alarm study's printout: shares with their Wilson intervals, the pilot's choice, the decision."""

from attnscale.experiments import alarm_study_text as txt


def test_share_text():
    assert txt.share_text({"k": 0, "n": 0, "share": None, "interval": None}) == "— (none)"
    assert txt.share_text({"k": 22, "n": 22, "share": 1.0, "interval": (0.851, 1.0)}) == "22/22, 100% [85%, 100%]"


def test_pilot_printout():
    shares = {0.05: {"k": 0, "n": 8, "share": 0.0, "interval": (0.0, 0.324), "never_learned": 0},
              0.06: {"k": 4, "n": 8, "share": 0.5, "interval": (0.215, 0.785), "never_learned": 1}}
    text = txt.format_result({"pilot": True, "shares": shares, "choice": {"rate": 0.06, "add": None}})
    assert "rate 0.06: broke mid-run 4/8, 50% [22%, 78%] of learned (1 never learned)" in text
    assert text.endswith("the study's rate: 0.06")
    none = txt.format_result({"pilot": True, "shares": shares, "choice": {"rate": None, "add": 0.065}})
    assert none.endswith("no rate qualifies; the rule adds 0.065 on the pilot's seeds")
    fallback = txt.format_result({"pilot": True, "shares": shares,
                                  "choice": {"rate": 0.0548, "add": None, "fallback": True, "added": 0.0548}})
    assert fallback.endswith("the study's rate: 0.0548 (none in 25-75% after the added 0.0548: the rule takes the "
                             "rate nearest 50%, a tie to the lower)")


def test_study_printout_gives_each_arm_and_the_alarms_median_step():
    from attnscale.analysis import alarm_judging as aj

    def row(arm, seed, loss, alarm=None, broke=None):
        probes = [{"step": s, "max_score": 2e4 if alarm is not None and s >= alarm else 50.0} for s in range(0, 3000, 10)]
        losses = [3.0] * 200 + [1.6] * 2800
        if broke is not None:
            losses[broke:] = [2.8] * (3000 - broke)
        return {"arm": arm, "seed": seed, "lr": 0.06, "probes": probes, "valid_loss": loss, "losses": losses,
                "outcome": {"learned_at": 200, "break_step": broke}}

    rows = [row("A", 0, 2.0, alarm=1200), row("A", 1, 2.2, alarm=1600), row("A", 2, 2.4, alarm=1300, broke=2000),
            *(row(a, s, 1.6 + 0.01 * s) for a in "BCEF" for s in range(3))]
    text = txt.format_result({"rate": 0.06, "interim": True, "seeds": {"A": [0, 1, 2]}, **aj.judge(rows)})
    assert "false-alarm share among holders: 2/2, 100% [34%, 100%], the alarm at step 1,400 (median)" in text
    # A: 2.0, 2.2, 2.4, sd 0.2, 2.2 ± 4.303 · 0.2 / sqrt(3) = [1.703, 2.697], at the SE's precision
    assert "    A          2.20 [1.70, 2.70] (3 runs, 1 broke, 0 never learned)" in text
    assert "    A holders  2.10 [0.83, 3.37] (2 runs)" in text  # 2.0, 2.2: 2.1 ± 12.706 · 0.1
    assert "    A breakers 2.400 (n=1, no interval) (1 run)" in text
