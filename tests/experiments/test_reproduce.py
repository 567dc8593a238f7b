"""`attnscale reproduce --quick`: every stage, the report, resume, and a clash of settings."""

import json
from dataclasses import replace

import pytest

from attnscale.cli import main
from attnscale.runs.record import TrainRun, find as find_records


QUICK_STEPS = 30  # half the quick preset's 60: the same stages, records and report; its run 47 -> 33 s alone at one thread


@pytest.fixture(scope="module", autouse=True)
def _shorter_quick_preset():
    """The quick budget cut to QUICK_STEPS wherever it is read (the stages, and the report that names the
    preset), for every test here: a rerun must find the same settings."""
    from attnscale.experiments import dynamics, sweep
    from attnscale.lm import presets

    real = presets.budget

    def budget(name="default", vocab_size=0):
        b = real(name, vocab_size)
        return replace(b, train=presets.with_steps(b.train, QUICK_STEPS)) if name == "quick" else b

    with pytest.MonkeyPatch.context() as mp:
        for module in (presets, dynamics, sweep):
            mp.setattr(module, "budget", budget)
        yield


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "out"
    assert main(["reproduce", "--quick", "--out", str(out), "-j", "1"]) == 0
    return out


def test_quick_writes_every_stage_and_the_report(quick_out, capsys):
    """(The fixture ran it; stderr is gone by now, so the ETA line is checked in test_full_preset.py.)"""
    groups = {p.relative_to(quick_out).parts[0] for p in find_records(quick_out)}
    assert groups == {"spread", "fresh-unit", "fresh-model", "dynamics", "sweep", "schemes"}
    # beside the pairs, the floors: the corpus's counted ones (sweep/floors) and the uniform model at 128
    sweep = [TrainRun.load(p) for p in find_records(quick_out / "sweep")]
    assert {(r.head_dim, r.scale) for r in sweep} == ({(w, s) for w in (32, 128, 1024) for s in ("none", "inv_sqrt_d")}
                                                      | {(128, "uniform")})
    assert (quick_out / "sweep" / "floors.json").exists()
    assert all(r.status in ("done", "diverged") for r in sweep)
    assert {r.steps_done for r in sweep if r.status == "done"} == {QUICK_STEPS}
    md = (quick_out / "report" / "report.md").read_text()
    for section in ("spread of q·k", "A fresh head", "during training", "held-out perplexity by width",
                    "Beyond the course: which scale?"):
        assert section in md
    lines = md.splitlines()
    head = md[:md.index("## 1.")]
    assert lines[0].endswith("(quick preset)") and lines[2].startswith("**Scoreboard:")  # the verdict count first
    assert "\n> **Quick preset" in head  # never taken for the full one
    assert "not run" not in lines[2]  # the scoreboard: every claim was judged
    assert "2 runs are copies of runs another stage trained" in head  # the sweep's widest pair is the dynamics pair: counted once
    assert (quick_out / "report" / "index.html").stat().st_size > 50_000


def test_rerun_keeps_what_is_on_disk(quick_out):
    before = {p: (p / "record.json").stat().st_mtime_ns for p in find_records(quick_out)}
    assert main(["reproduce", "--quick", "--out", str(quick_out), "-j", "1"]) == 0
    after = {p: (p / "record.json").stat().st_mtime_ns for p in find_records(quick_out)}
    assert after == before


def test_other_settings_in_the_same_folder_are_refused(quick_out, capsys):
    assert main(["reproduce", "--quick", "--seed", "1", "--out", str(quick_out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "other settings" in err and "--out" in err


def test_it_ends_with_the_scoreboard_the_report_judged(quick_out, capsys):
    from attnscale.reproduce import scoreboard
    from attnscale.report.assemble import load_runs, verdicts

    judged = verdicts(load_runs(quick_out))
    lines = scoreboard(quick_out)
    counts = {w: sum(v.verdict == w for v in judged) for w in ("agrees", "partly", "differs")}
    assert lines[0] == (f"scoreboard: {counts['agrees']} agree, {counts['partly']} partly, {counts['differs']} differ "
                        f"(of the course's {len(judged)} claims)")
    others = [v for v in judged if v.verdict != "agrees"]
    assert len(lines) == 1 + len(others)
    for line, v in zip(lines[1:], others):
        assert line.split()[0] == v.verdict.split()[0] and "…" not in line and f"here {v.ours}" in line
    assert main(["report", str(quick_out), "--out", str(quick_out / "report")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[: len(lines)] == lines  # `report` prints the same board; reproduce prints it before the paths


def test_claims_that_continue_the_one_before_borrow_its_subject():
    from types import SimpleNamespace as V

    from attnscale.reproduce import _named

    claims = [V(experiment="dynamics", claim="d=1024, no scale: spread about 21 at the start"),
              V(experiment="dynamics", claim="… grows to over 5,000 by the end"),
              V(experiment="dynamics", claim="… and 99.9% of rows end frozen"),
              V(experiment="spread", claim="raw score spread at d=4 is √d")]
    assert _named(claims) == ["d=1024, no scale: spread about 21 at the start", "d=1024, no scale: grows to over 5,000 by the end",
                              "d=1024, no scale: 99.9% of rows end frozen", "raw score spread at d=4 is √d"]
