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
