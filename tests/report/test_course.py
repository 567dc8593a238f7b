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
    row = {"head_dim": 1024, "pairs": 20000}
    assert math.isclose(course.spread_se(row) / 32, 0.5 * math.sqrt((2 + 6 / 1024) / 20000))
    assert 0.004 < course.spread_se(row) / 32 < 0.006
    assert course.spread_se({**row, "raw_spread_se": 0.1}) == 0.1


def test_spread_outside_three_se_differs(tmp_path):
    root = write_runs(tmp_path, training=False)
    rec = json.loads((root / "spread" / "record.json").read_text())
    for r in rec["results"]:
        if r["head_dim"] == 256:
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


def test_dynamics_at_another_head_dim_is_not_judged_at_1024(tmp_path):
    from test_report import _train

    root = write_runs(tmp_path, training=False)
    _train(root, "dynamics", 256, "none", 0, ppl=60.0, corpus="c")
    v = _verdicts(root)["d=1024, no scale: spread about 21 at the start"]
    assert v.verdict == course.NOT_RUN and "d=256" in v.note


def test_gap_se_needs_two_seeds_and_start_is_where_every_wider_head_dim_agrees(tmp_path):
    from test_report import _train

    root = tmp_path
    for d, gap in ((32, 0.1), (128, 2.2), (256, 18.0)):
        _train(root, "sweep", d, "inv_sqrt_d", 0, ppl=40.0, corpus="c")
        _train(root, "sweep", d, "none", 0, ppl=40.0 + gap, corpus="c")
    runs = load_runs(root)
    gaps = course.gap_by_head_dim(runs)
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



def _dynamics_pair(root, start_spread, end_spread=5200.0, end_frozen=0.999):
    from test_report import _train

    _train(root, "dynamics", 1024, "none", 0, ppl=50.0, corpus="c", start=(start_spread, 0.3, 3.0),
           end=(end_spread, end_frozen, 1.0))
    _train(root, "dynamics", 1024, "inv_sqrt_d", 0, ppl=40.0, corpus="c", start=(3.0, 0.0, 30.0), end=(3.4, 0.0, 20.0))
    return root


START = "d=1024, no scale: spread about 21 at the start"


def test_start_spread_is_judged_on_layer_0_and_shows_the_mean_of_all_layers(tmp_path):
    # the fixture's layer 1 is 30% above layer 0: layer 0 = 21.2, all layers 24.4
    v = _verdicts(_dynamics_pair(tmp_path / "a", 21.2))[START]
    assert v.verdict == course.AGREES
    assert v.ours.startswith("21.2 in layer 0") and "mean over all 2 layers: 24.4" in v.ours
    assert "n=1, no interval" in v.ours
    # layer 0 = 15.9: the mean over layers (18.3) sits inside ±25% of 21, layer 0 is not within ±10%
    v = _verdicts(_dynamics_pair(tmp_path / "b", 15.9))[START]
    assert v.verdict == course.DIFFERS and "15.9 in layer 0" in v.ours


def test_growth_short_of_the_course_is_partly_and_no_growth_differs(tmp_path):
    grows, frozen = "… grows to over 5,000 by the end", "… and 99.9% of rows end frozen"
    v = _verdicts(_dynamics_pair(tmp_path / "a", 21.0, end_spread=344.0, end_frozen=0.927))
    assert v[grows].verdict == course.PARTLY and "up from" in v[grows].note
    assert v[frozen].verdict == course.PARTLY
    v = _verdicts(_dynamics_pair(tmp_path / "b", 21.0, end_spread=10.0, end_frozen=0.1))
    assert v[grows].verdict == course.DIFFERS and v[frozen].verdict == course.DIFFERS
    v = _verdicts(_dynamics_pair(tmp_path / "c", 21.0))
    assert v[grows].verdict == v[frozen].verdict == course.AGREES


def _sweep(root, gaps, seeds=(0,)):
    from test_report import _train

    for d, gap in gaps.items():
        for seed in seeds:
            _train(root, "sweep", d, "inv_sqrt_d", seed, ppl=40.0, corpus="c")
            _train(root, "sweep", d, "none", seed, ppl=40.0 + gap + 0.05 * seed, corpus="c")
    return _verdicts(root)


D32 = "d=32: no difference (unscaled very slightly ahead)"


def test_d32_sign_is_part_of_the_claim(tmp_path):
    v = _sweep(tmp_path / "a", {32: 0.72})[D32]  # the scaled run ahead, however slightly: differs
    assert v.verdict == course.DIFFERS and "scaled run is ahead" in v.note
    assert _sweep(tmp_path / "b", {32: -0.3})[D32].verdict == course.AGREES
    v = _sweep(tmp_path / "c", {32: -23.2})[D32]  # unscaled ahead, by far more than "very slightly"
    assert v.verdict == course.PARTLY and "direction holds" in v.note
    # with seeds: gaps 0, 0.05, 0.10, +0.05 ± 0.029, 95% interval (2 df) −0.074 to +0.174 covers both
    # signs: neither "agrees" nor "differs" but inconclusive
    v = _sweep(tmp_path / "d", {32: 0.0}, seeds=(0, 1, 2))[D32]
    assert v.verdict == course.INCONCLUSIVE and "-0.07 – +0.17" in v.ours.replace("−", "-")
    # a wrong-sign gap whose interval lies wholly above 0 differs: +0.8, +0.85, +0.9 → 0.85 ± 0.124
    assert _sweep(tmp_path / "e", {32: 0.8}, seeds=(0, 1, 2))[D32].verdict == course.DIFFERS
    # and a right-sign gap whose interval lies wholly at or below 0 agrees
    assert _sweep(tmp_path / "f", {32: -0.5}, seeds=(0, 1, 2))[D32].verdict == course.AGREES


def test_a_wrong_sign_gap_never_agrees_however_wide_its_noise(tmp_path):
    # the case: d=128 at −0.5 with a large SE used to agree with "helps by about 2" (3 SE of slack)
    helps = "d=128: the scale helps by about 2 points"
    v = _sweep(tmp_path / "a", {128: -0.5}, seeds=(0, 1))  # −0.5, −0.45: both seeds wrong, interval −0.79 to −0.16
    assert v[helps].verdict == course.DIFFERS and "-0.79 – -0.16" in v[helps].ours.replace("−", "-")
    assert _sweep(tmp_path / "b", {128: -0.5})[helps].verdict == course.DIFFERS  # one seed: the sign decides


def test_gap_of_the_right_sign_but_wrong_size_is_partly(tmp_path):
    wide = "d ≥ 256: worth 17 to 18 points"
    v = _sweep(tmp_path / "a", {128: 2.1, 256: 2.3, 512: 3.0, 1024: 6.3})
    assert v[wide].verdict == course.PARTLY
    assert v["d=128: the scale helps by about 2 points"].verdict == course.AGREES
    v = _sweep(tmp_path / "b", {128: 12.9, 256: -1.0, 512: 90.0})
    assert v[wide].verdict == course.DIFFERS and "direction does not hold" in v[wide].note
    assert v["d=128: the scale helps by about 2 points"].verdict == course.PARTLY


def test_reasons_list_every_claim_that_does_not_agree(tmp_path):
    got = course.evaluate(load_runs(write_runs(tmp_path / "a")))
    assert course.reasons(got) == []
    root = write_runs(tmp_path / "b", training=False)
    _sweep(root, {32: 0.72, 128: 2.0})
    got = course.evaluate(load_runs(root))
    lines = course.reasons(got)
    assert len(lines) == 1 and lines[0].startswith(D32) and "differs" in lines[0] and "+0.72" in lines[0]


def test_course_and_analysis_load_no_experiment_and_no_matplotlib():
    import subprocess
    import sys

    code = ("import sys, attnscale.analysis.gaps, attnscale.report.course; "
            "print(sorted(m for m in sys.modules if m.startswith(('attnscale.experiments', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_claim_has_a_name_that_stands_alone():
    names = [c.title for c in course.CLAIMS]
    assert len(set(names)) == len(names)
    assert not [n for n in names if n.startswith("…")]  # "… grows to over 5,000" names nothing on its own
    assert "d=1024, no scale: the spread grows to over 5,000 by the end" in names


def test_scoreboard_counts_and_names_the_claims_that_do_not_agree(tmp_path):
    head, lines = course.scoreboard(course.evaluate(load_runs(write_runs(tmp_path / "a"))))
    assert head == f"{len(course.CLAIMS)} agree, 0 partly, 0 differ of {len(course.CLAIMS)} claims" and lines == []
    root = write_runs(tmp_path / "b")
    for seed in (0, 1):  # the scaled run ahead at d=32: differs
        path = root / "sweep" / f"d32-none-s{seed}" / "record.json"
        rec = json.loads(path.read_text())
        rec["results"]["perplexity"] = 40.72 + 0.1 * seed
        path.write_text(json.dumps(rec))
    path = root / "dynamics" / "d1024-none-s0" / "metrics.jsonl"  # the end spread grown, short of 5,000: partly
    path.write_text(path.read_text().replace("5200.0", "800.0"))
    got = course.evaluate(load_runs(root))
    head, lines = course.scoreboard(got)
    n = len(course.CLAIMS)
    assert head == f"{n - 2} agree, 1 partly, 1 differ of {n} claims", head
    assert lines[0].startswith("d=1024, no scale: the spread grows to over 5,000 by the end: partly (course > 5,000")
    assert lines[1].startswith(D32 + ": differs (course ≈ 0, gap ≤ 0, ours d=32: +0.72")
    assert all(line.split(":")[0] for line in lines)
    assert course.scoreboard(got, figures=False)[1][1] == D32 + ": differs"


def test_a_frozen_share_is_never_printed_with_an_se_of_zero():
    # 70% of 200 × 64 rows: SE sqrt(0.7 · 0.3 / 12,800) = 0.41 points
    assert course._frozen({"frozen_fraction": 0.7, "sequences": 200, "words": 64}) == \
        "70.0% of 12,800 rows frozen (SE 0.4 pts)"
    # none frozen: a binomial SE of 0 says nothing; the rule of three's 95% bound is 3 / 12,800 = 0.023%
    assert course._frozen({"frozen_fraction": 0.0, "sequences": 200, "words": 64}) == \
        "0% of 12,800 rows frozen (95% bound: under 0.023%)"
    # 99.95%: SE sqrt(0.9995 · 0.0005 / 12,800) = 0.020 points, so two decimals
    assert course._frozen({"frozen_fraction": 0.9995, "sequences": 200, "words": 64}) == \
        "99.95% of 12,800 rows frozen (SE 0.02 pts)"


def test_a_figure_reached_agrees_even_where_it_did_not_rise(tmp_path):
    # rows frozen at 99.5% from the start and at the end: the claim's figure (≥ 99%) holds, so it agrees;
    # whether it rose only decides between "partly" and "differs" when the figure is not reached
    from test_report import _train

    root = tmp_path / "r"
    _train(root, "dynamics", 1024, "none", 0, ppl=50.0, corpus="c", start=(21.0, 0.995, 1.0), end=(6000.0, 0.995, 1.0))
    _train(root, "dynamics", 1024, "inv_sqrt_d", 0, ppl=40.0, corpus="c", start=(3.0, 0.0, 30.0), end=(3.4, 0.0, 20.0))
    v = _verdicts(root)
    assert v["… and 99.9% of rows end frozen"].verdict == course.AGREES
    assert v["frozen heads do not recover; they get worse"].verdict == course.AGREES  # level: not a recovery
