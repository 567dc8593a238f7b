"""tools/act_study_figures.py: the act study's figures from a tiny hand-made series file alone, each number
checked against what the hand-made runs were made to give."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "act_study_figures.py"


def _tool():
    spec = importlib.util.spec_from_file_location("act_study_figures", TOOL)  # tools/ is no package
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _losses(break_at=None, n=400):
    # learns at step 36 (the level 1.9318: 17 losses of 1.7 and 3 of 3.0 in the window), breaks by +1 nat at break_at
    return [3.0] * 20 + [1.7] * ((break_at or n) - 20) + ([2.7] * (n - break_at) if break_at else [])


def _run(prefix, cell, arm, seed, losses, valid, probes=(), alarm=None):
    return {"run_id": f"{prefix}-{cell}-{arm}-seed{seed}", "cell": cell, "arm": arm, "seed": seed,
            "pilot": prefix == "pilot", "steps": len(losses), "losses": losses,
            "probes": [{"step": s, "max_score": m} for s, m in probes], "outcome": {}, "valid_loss": valid,
            "alarm_step": alarm, "action_steps": [] if alarm is None else [alarm], "actions": []}


@pytest.fixture
def series(tmp_path):
    runs = [
        # the pilot: one break at 300, crossing 3e2 at 150 (150 ahead) and 1e3 at 250 (50 ahead): level 3e2
        _run("pilot", "z0", "A", 100, _losses(300), 2.5, [(150, 500.0), (250, 2000.0)]),
        _run("pilot", "z0", "A", 101, _losses(), 1.8, [(100, 400.0)]),
    ]
    for seed in (0, 1, 2):  # A breaks in every pair; C holds (alarm at 200), a little worse than E; seed 2 lacks C
        runs.append(_run("study", "z0", "A", seed, _losses(250), 2.5))
        if seed < 2:
            runs.append(_run("study", "z0", "C", seed, _losses(), 1.70 + 0.02 * seed, alarm=200))
        runs.append(_run("study", "z0", "E", seed, _losses(), 1.70))
    path = tmp_path / "series.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"study": "act", "floor": 2.2665, "learned_level": 1.9318,
                                               "runs": runs}).encode()))
    return path


def test_the_figures_come_again_from_the_series_alone(series, capsys):
    assert _tool()([str(series), "--json"]) == 0
    fig = json.loads(capsys.readouterr().out)
    assert fig["pilot"]["level"] == 300.0 and fig["pilot"]["break_steps"] == [300]
    levels = {t["level"]: t for t in fig["pilot"]["levels"]}
    assert levels[300.0]["leads"] == [150] and levels[1000.0]["leads"] == [50] and levels[300.0]["held_crossed"] == 1
    study = fig["study"]
    assert study["seeds"] == [0, 1]  # seed 2 has no C run: not a whole seed
    c = study["arms"]["C"]
    assert (c["breaks_vs_A"]["b"], c["breaks_vs_A"]["c"], c["breaks_vs_A"]["p"]) == (2, 0, 0.5)  # 2 · (1/2)²
    assert c["loss_vs_E"]["diff"] == pytest.approx(0.01) and c["loss_vs_E"]["n"] == 2
    assert c["loss_vs_A"]["diff"] == pytest.approx(1.71 - 2.5)
    assert c["share_vs_E"]["share"] == pytest.approx(0.01 / (2.2665 - 1.70))
    assert c["decision"] == "inconclusive"  # fewer breaks, but p = 0.5
    assert study["arms"]["A"]["tally"] == {"runs": 2, "learned": 2, "mid_run_breaks": 2, "degraded": 2,
                                           "never_learned": 0}
    assert [(p["seed"], p["C"]["alarm_step"], p["A"]["break_step"]) for p in fig["pairs"] if "C" in p] == [
        (0, 200, 250), (1, 200, 250)]


def test_the_tables_print(series, capsys):
    assert _tool()([str(series)]) == 0
    out = capsys.readouterr().out
    assert "Alarm level L = 300 (the highest level every break crossed early enough)." in out
    assert "Seeds read: 0 1 (interim)." in out and "broke 250" in out and "held, alarm 200" in out


def test_the_published_numbers_are_the_published_series(capsys):
    """docs/warn-study.json's "act" per-arm numbers, re-derived from docs/act-study-series.json.gz by the tool."""
    root = Path(__file__).resolve().parents[1]
    assert _tool()([str(root / "docs" / "act-study-series.json.gz"), "--json"]) == 0
    fig = json.loads(capsys.readouterr().out)
    act = json.loads((root / "docs" / "warn-study.json").read_text(encoding="utf-8"))["act"]
    assert fig["pilot"]["level"] == act["level"] and fig["study"]["seeds"] == act["seeds"]
    for arm, got in fig["study"]["arms"].items():
        kept = act["arms"][arm]
        assert {k: kept[k] for k in got["tally"]} == got["tally"]
        for key in ("breaks_vs_A", "loss_vs_A", "loss_vs_E"):
            if key in got:
                assert kept[key]["p"] == pytest.approx(got[key]["p"]) if got[key]["p"] is not None else kept[key]["p"] is None
                if key != "breaks_vs_A":
                    assert kept[key]["diff"] == pytest.approx(got[key]["diff"], abs=1e-4)  # the series rounds to 6 digits
        assert kept.get("decision") == got.get("decision")


def test_the_docs_table_holds_the_published_numbers():
    root = Path(__file__).resolve().parents[1]
    act = json.loads((root / "docs" / "warn-study.json").read_text(encoding="utf-8"))["act"]
    doc = (root / "docs" / "act-study.md").read_text(encoding="utf-8")
    for arm, a in act["arms"].items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| {arm} ("))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:6] == [str(a[k]) for k in ("runs", "learned", "mid_run_breaks", "degraded", "never_learned")]
        if "breaks_vs_A" in a:
            b = a["breaks_vs_A"]
            assert cells[6] == f"{b['b']}, {b['c']}, p {b['p']:.3g}"
        if "loss_vs_E" in a:
            lo, hi = a["loss_vs_E"]["interval"]
            assert cells[8].startswith(f"{a['loss_vs_E']['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]".replace("-", "−"))
        if a.get("decision"):
            assert cells[11] == a["decision"]


def test_the_warn_study_page_s_act_table_holds_the_published_numbers():
    """docs/warn-study.md repeats the per-arm table at its top: every cell read from docs/warn-study.json's "act"."""
    root = Path(__file__).resolve().parents[1]
    act = json.loads((root / "docs" / "warn-study.json").read_text(encoding="utf-8"))["act"]
    doc = (root / "docs" / "warn-study.md").read_text(encoding="utf-8")
    top = doc[:doc.index("## The answer, from the study")]

    def cell(x):
        lo, hi = x["interval"]
        return f"{x['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]".replace("-", "−")

    for arm, a in act["arms"].items():
        row = next(line for line in top.splitlines() if line.startswith(f"| {arm} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:6] == [str(a[k]) for k in ("runs", "learned", "mid_run_breaks", "degraded", "never_learned")]
        b = a.get("breaks_vs_A")
        assert cells[6] == ("—" if b is None else f"{b['b']}, {b['c']}, p {b['p']:.3g}")
        assert cells[7] == (cell(a["loss_vs_A"]) if "loss_vs_A" in a else "—")
        assert cells[8] == (cell(a["loss_vs_E"]) if "loss_vs_E" in a else "—")
        st = a["step_time_ratio"]
        assert cells[9] == ("1" if st["interval"] is None
                            else f"{st['mean']:.2f} [{st['interval'][0]:.2f}, {st['interval'][1]:.2f}]")


def test_the_seed_as_unit_re_read_in_the_doc_re_derives_by_hand():
    """docs/act-study.md's seed-as-unit table and C − B equivalence, from the published series by hand: each seed's
    two cells averaged, then mean and t interval over 16 seeds (t(0.975, 15) = 2.131450, t(0.95, 15) = 1.753050)."""
    import gzip
    import json
    import math
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = json.loads(gzip.decompress((root / "docs" / "act-study-series.json.gz").read_bytes()))
    loss = {(r["cell"], r["seed"], r["arm"]): r["valid_loss"] for r in data["runs"] if not r["pilot"]}
    seeds = sorted({s for _, s, _ in loss})
    assert len(seeds) == 16
    doc = (root / "docs" / "act-study.md").read_text(encoding="utf-8")

    def diffs(arm, other):
        return [statistics.fmean(loss[(c, s, arm)] - loss[(c, s, other)] for c in ("z0", "z1e-4")) for s in seeds]

    def text(xs, digits, q=2.131450):
        m, se = statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))
        lo, hi = m - q * se, m + q * se
        return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]".replace("-", "−")

    for arm, vs_a, vs_e in (("B", 3, 4), ("C", 3, 4), ("D", 3, 3)):
        row = next(line for line in doc.splitlines() if line.startswith(f"| {arm} (") and "16 seeds" not in line
                   and line.count("|") == 4)
        assert text(diffs(arm, "A"), vs_a) in row and text(diffs(arm, "E"), vs_e) in row, row
    cb = diffs("C", "B")
    assert text(cb, 3) in doc and text(cb, 3) in (root / "docs" / "watch.md").read_text(encoding="utf-8")
    lo90, hi90 = text(cb, 3, q=1.753050).split("[")[1].rstrip("]").split(", ")
    assert f"90% interval [{lo90}, {hi90}]" in doc
    assert -0.02 < float(lo90.replace("−", "-")) and float(hi90.replace("−", "-")) < 0.02  # so: equivalent


def test_the_advice_reads_its_false_alarm_share_from_the_warn_study():
    """docs/watch.md says the alarm fired in 22 of 22 held runs at 8e-2, Wilson [85%, 100%]: counted here from
    docs/warn-study.json's cells, the interval by hand (0 misses: lower end n / (n + z²)). (README and
    default_alerts quote the alarm study's share, where some runs hold: tests/experiments/test_alarm_study.py.)"""
    import math
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cells = json.loads((root / "docs" / "warn-study.json").read_text())["recipe"]["cells"]
    at = [c for c in cells if c["lr"] == 0.08 and c["arm"].startswith("qk-off")]
    held = sum(c["learned"] - c["mid_run_breaks"] for c in at)
    fired = sum(c["detectors"]["max_score>10000"]["false_alarms"]["false_alarms"] for c in at)
    assert (fired, held) == (22, 22)
    lower = held / (held + 1.959964 ** 2)
    assert f"{math.floor(lower * 100)}%" == "85%"
    flat = " ".join((root / "docs" / "watch.md").read_text().split())
    assert "22 of 22" in flat and "[85%, 100%]" in flat
