"""course: each claim of the chapter judged against records, with its tolerance."""

from __future__ import annotations

import json
import math

from test_report import _fresh_row, _record, write_runs

from attnscale.report import course
from attnscale.report import load_runs


def _verdicts(root):
    return {v.claim: v for v in course.evaluate(load_runs(root))}


def test_every_claim_agrees_on_records_made_to_agree(tmp_path):
    got = course.evaluate(load_runs(write_runs(tmp_path)))
    assert len(got) == len(course.CLAIMS)
    assert [v.claim for v in got if v.verdict != course.AGREES] == []


def test_missing_experiments_are_not_run_and_say_so(tmp_path):
    v = _verdicts(write_runs(tmp_path, training=False))
    dyn = [x for x in v.values() if x.experiment in ("dynamics", "sweep")]
    assert dyn and all(x.verdict == course.NOT_RUN and x.note for x in dyn)
    assert all(x.verdict == course.AGREES for x in v.values() if x.experiment in ("spread", "fresh"))


def test_spread_se_formula_matches_the_footnote_variance():
    # relative SE of the sample std of q·k: ½·sqrt((2 + 6/d)/n), about 0.5% at n = 20,000
    row = {"width": 1024, "pairs": 20000}
    assert math.isclose(course.spread_se(row) / 32, 0.5 * math.sqrt((2 + 6 / 1024) / 20000))
    assert 0.004 < course.spread_se(row) / 32 < 0.006
    assert course.spread_se({**row, "raw_spread_se": 0.1}) == 0.1


def test_spread_outside_three_se_differs(tmp_path):
    root = write_runs(tmp_path, training=False)
    rec = json.loads((root / "spread" / "record.json").read_text())
    for r in rec["results"]:
        if r["width"] == 256:
            r["raw_spread"] = 16 + 4 * r["raw_spread_se"]
    (root / "spread" / "record.json").write_text(json.dumps(rec))
    v = _verdicts(root)
    assert v["raw score spread at d=256 is √d"].verdict == course.DIFFERS
    assert v["raw score spread at d=64 is √d"].verdict == course.AGREES


def test_seven_in_ten_uses_the_rounding_interval_and_binomial_se(tmp_path):
    root = write_runs(tmp_path, training=False)
    claim = "d=1024, no scale: seven rows in ten frozen before training"
    for frozen, want in ((0.76, course.AGREES), (0.80, course.DIFFERS), (0.62, course.DIFFERS)):
        rows = [_fresh_row("unit", d, s, frozen=frozen if (d, s) == (1024, "none") else None)
                for d in (256, 1024) for s in ("none", "inv_sqrt_d")]
        _record(root / "fresh-unit", "fresh", {"init": "unit"}, {"rows": rows})
        v = _verdicts(root)[claim]
        assert v.verdict == want, (frozen, v)  # 200 × 64 rows: 3 SE ≈ 1.2 points
        assert v.beside.startswith("model init:")


def test_dynamics_at_another_width_is_not_judged_at_1024(tmp_path):
    from test_report import _train

    root = write_runs(tmp_path, training=False)
    _train(root, "dynamics", 256, "none", 0, ppl=60.0, corpus="c")
    v = _verdicts(root)["d=1024, no scale: spread about 21 at the start"]
    assert v.verdict == course.NOT_RUN and "d=256" in v.note


def test_gap_se_needs_two_seeds_and_start_is_where_every_wider_width_agrees(tmp_path):
    from test_report import _train

    root = tmp_path
    for d, gap in ((32, 0.1), (128, 2.2), (256, 18.0)):
        _train(root, "sweep", d, "inv_sqrt_d", 0, ppl=40.0, corpus="c")
        _train(root, "sweep", d, "none", 0, ppl=40.0 + gap, corpus="c")
    runs = load_runs(root)
    gaps = course.gap_by_width(runs)
    assert gaps[128][1] is None and gaps[128][2] == 1 and math.isclose(gaps[256][0], 18.0)
    assert course.gap_start(runs) == 128
    v = _verdicts(root)
    assert v["d=128: the scale helps by about 2 points"].verdict == course.AGREES
    assert "no noise estimate" in v["d=128: the scale helps by about 2 points"].ours


def test_report_and_sweep_cli_name_the_same_start(tmp_path):
    """A narrow width with a gap, then none, then gaps: the start is where every wider width agrees,
    as ``attnscale sweep`` prints it, not the first width with a gap."""
    from test_report import _train

    from attnscale.experiments import sweep

    for d, gap in ((32, 0.5), (64, 2.0), (128, 0.5), (256, 18.0)):
        _train(tmp_path, "sweep", d, "inv_sqrt_d", 0, ppl=40.0, corpus="c")
        _train(tmp_path, "sweep", d, "none", 0, ppl=40.0 + gap, corpus="c")
    runs = load_runs(tmp_path)
    rows = sweep.rows_from_records(runs.sweep)
    assert course.gap_start(runs) == sweep.gap_table(rows)["gap_starts_at"] == 256

