"""report/recipe_section: the recipe study's section words the judged numbers as they are, intervals and
all, for hand-made runs whose counts are worked out in tests/analysis/test_recipe_judging.py."""

import math

from attnscale.analysis import recipe_judging as rs
from attnscale.report import recipe_section as sec
from attnscale.report.blocks import Bullets, Table
from test_recipe_judging import CELL, FLOOR, LEVEL  # noqa: the hand-made cell


def wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_the_section_shows_each_detectors_judged_numbers_and_why_no_default_was_met():
    result = rs.judge(CELL, LEVEL, FLOOR)
    pilot = {"bigram": 2.5, "uniform": None, "floor": FLOOR, "best": 1.0, "level": LEVEL, "chosen": [0.1],
             "lrs": [0.1], "runs": 4}
    got = sec.section({"pilot": pilot, **result, "verdict": rs.verdict(result, [0.1])})
    seeds = len({r["seed"] for r in CELL})
    assert f"ladder, {seeds} seeds on the rungs its pilot chose (0.1)" in got[1].text
    tables = [b for b in got if isinstance(b, Table)]
    assert tables[0].rows == [["qk-off-z0", "0.1", 4, 4, "2 (2 + 0)", 2, 0]]
    row = next(r for r in tables[1].rows if r[0] == "max_score>100")
    lo, hi = wilson(1, 2)
    assert row[1] == "100/100" and row[2] == f"1/2 [{100 * lo:.0f}%, {100 * hi:.0f}%]" == "1/2 [9%, 91%]"
    assert row[3].startswith(f"{1000 / 234:.2f} [") and row[4] == "20 (one run)"  # one hit: no interval
    assert row[5] == "inconclusive"
    why = next(b for b in got if isinstance(b, Bullets))
    assert any(i.startswith("max_score>100: ") and "4.27 false alarms per 1,000 steps" in i for i in why.items)


def test_texts_say_dash_where_there_is_nothing_to_count():
    assert sec.hits_text({"hits": 0, "breaks": 0, "ci": None}) == "—"
    assert sec.per_1000_text({"per_1000": None, "ci": None}) == "—"
    assert sec.per_1000_text({"per_1000": 0.5, "ci": None}) == "0.50 (no interval)"
    assert sec.lead_text({"median": None, "ci": None}) == "—"
    assert sec.lead_text({"hits": 1, "median": 30, "ci": None}) == "30 (one run)"
    assert sec.lead_text({"hits": 4, "median": 30, "ci": (10, 50)}) == "30 [10, 50]"
    # a percentile between whole steps widens to the steps around it; a median of two is the half-step it is
    assert sec.lead_text({"hits": 4, "median": 568.5, "ci": (425.788, 639.2)}) == "568.5 [425, 640]"


def test_the_example_is_the_first_break_of_a_chosen_rung_with_the_alarms_it_was_judged_by(tmp_path, monkeypatch):
    from attnscale.report import warn_plots

    result = rs.judge(CELL, LEVEL, FLOOR)
    result["pilot"] = {"chosen": [0.1]}
    drawn = {}

    def draw(series, marks, broken_at, path, title):
        drawn.update(marks=marks, broken_at=broken_at, title=title)
        return path

    monkeypatch.setattr(warn_plots, "example_run", draw)
    pngs = {}
    got = sec.example(CELL, result, tmp_path, pngs)
    # seed 0 breaks at 80; the literature's 1e3 never fires on its 500; the loss's spike fires at the break's
    # own step (no lead, so not drawn); the gradient norm is not in these hand-made probes
    assert drawn == {"marks": {"max_score>1000": None, "loss_spike": None, "grad_norm_spike": None},
                     "broken_at": 80, "title": "qk-off-z0, lr 0.1, seed 0"}
    assert pngs == {sec.EXAMPLE_PNG: tmp_path / f"{sec.EXAMPLE_PNG}.png"} and len(got) == 1
    # no chosen rung with a break: no figure
    result["pilot"] = {"chosen": [0.3]}
    assert sec.example(CELL, result, tmp_path, {}) == []
