"""experiments/warn_study and `attnscale warn-study`: the grid and its checks, the smoke study end to end
through the runs/ layer (records, resume, the report section), the analysis on hand-made runs (thresholds
chosen on half the seeds, rates read on the other half), bad input, and the section's figures."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from attnscale import report
from attnscale.analysis import detectors as det
from attnscale.analysis import outcomes as oc
from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.analysis import alarms
from attnscale.experiments import warn_study as ws
from attnscale.report import warn_section


def test_the_full_preset_is_the_named_run():
    cfg = ws.preset()
    assert cfg.scales == ("none", "inv_sqrt_d") and cfg.norms == ("post", "pre") and cfg.warmups == (0, 20)
    assert cfg.lrs == (3e-3, 1e-2, 3e-2, 1e-1, 3e-1) and cfg.seeds == tuple(range(10)) and cfg.probe_every == 5
    assert cfg.train.record_every == 1 and cfg.train.min_lr_ratio == 1.0 and cfg.train.checkpoint_every > 0
    specs = ws.specs(cfg, 104)
    assert len(specs) == 2 * 2 * 2 * 5 * 10 and len({s.run_id for s in specs}) == len(specs)
    s = next(s for s in specs if s.run_id == "inv_sqrt_d-pre-warmup20-lr0.1-seed7")
    assert (s.model.scale, s.model.norm, s.train.warmup, s.train.lr, s.train.seed, s.group) == (
        "inv_sqrt_d", "pre", 20, 0.1, 7, "warn")


def test_the_llama_preset_is_the_named_run():
    cfg = ws.preset(family="llama")
    assert cfg.warmups == (0, 40) and cfg.lrs == (1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1) and cfg.seeds == tuple(range(12))
    assert cfg.train.steps == 400 and cfg.train.min_lr_ratio == 1.0 and cfg.train.checkpoint_every == 0
    specs = ws.specs(cfg, 104)
    assert len(specs) == 2 * 5 * 12 and len({s.run_id for s in specs}) == len(specs)
    s = next(s for s in specs if s.run_id == "llama-warmup40-lr0.08-seed7")
    assert (s.model.family, s.model.d_model, s.model.head_dim, s.model.context) == ("llama", 64, 16, 64)
    assert (s.train.warmup, s.train.lr, s.train.seed, s.train.record_every, s.train.batch, s.group) == (
        40, 0.08, 7, 5, 8, "warn")  # the watch every 5 steps
    assert [c.family for c in ws.configs("all")] == ["tiny", "llama"]


def test_bad_configs_say_what_is_wrong():
    with pytest.raises(ConfigError, match="unknown warn-study preset"):
        ws.preset("huge")
    with pytest.raises(ConfigError, match=r"seeds must be a non-empty list without repeats, got \[1, 1\]"):
        ws.WarnConfig(seeds=(1, 1))
    with pytest.raises(ConfigError, match="warm-ups must be whole steps below the run's 200"):
        ws.WarnConfig(warmups=(0, 200))


def test_the_smoke_study_runs_resumes_and_reports(tmp_path, capsys):
    cfg = ws.preset("smoke")
    result = ws.run(cfg, tmp_path, progress=False)
    assert len(result["rows"]) == 4 and result["choosing_seeds"] == (0,) and result["held_out_seeds"] == (1,)
    for r in result["rows"]:
        s = r["series"]
        assert s.steps == 40 and all(x is not None for x in s.losses)  # the loss at every step
        assert [p for p, _ in s.probes] == list(range(0, 40, 5))  # the watch every 5 steps
        assert len(s.probes[0][1]["max_score"]) == 2 * 4  # every head of every layer
    records = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/record.json")}
    again = ws.run(cfg, tmp_path, progress=False)  # everything finished: nothing trains again
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/record.json")} == records
    assert [r["run"] for r in again["rows"]] == [r["run"] for r in result["rows"]]
    # a record damaged on disk: set aside with the run's metrics and weights, never deleted; the run trained again
    damaged = sorted(tmp_path.glob("*/record.json"))[0].parent
    (damaged / "record.json").write_text('{"schema": 2, "experiment": "tr')
    kept = {name: (damaged / name).read_bytes() for name in ("record.json", "metrics.jsonl", "model.safetensors")}
    capsys.readouterr()
    resumed = ws.run(cfg, tmp_path, progress=False)
    assert {name: (damaged / f"{name}.damaged-1").read_bytes() for name in kept} == kept
    assert "set aside as metrics.jsonl.damaged-1" in capsys.readouterr().err
    assert [r["run"] for r in resumed["rows"]] == [r["run"] for r in result["rows"]]
    paths = report.build(tmp_path)
    assert f"## {warn_section.TITLE}" in paths["markdown"].read_text(encoding="utf-8")
    json.dumps(ws.as_json(result))  # plain numbers


def test_both_families_run_into_one_folder_and_report_apart(tmp_path, capsys):
    """The Llama through the real transformers Trainer, offline: the loss at every step, the watch every 5."""
    import math

    from attnscale.runs import record as rec

    assert main(["warn-study", "--family", "all", "--quick", "--out", str(tmp_path), "--json"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert set(study["families"]) == {"tiny", "llama"} and study["families"]["llama"]["family"] == alarms.FAMILIES["llama"]
    runs = [rec.TrainRun.load(p) for p in rec.find(tmp_path)]
    llama = [t for t in runs if alarms.family_of(t) == "llama"]
    assert len(llama) == 4 and len(runs) == 8 and all(t.run_id.startswith("llama-") and t.status == "done" for t in llama)
    result = alarms.analyse(runs, 3.237, family="llama")
    assert [r["run"] for r in result["rows"]] == sorted(t.run_id for t in llama) and result["key"] == "llama"
    for r in result["rows"]:
        s = r["series"]
        assert s.steps == 20 and all(x is not None and math.isfinite(x) for x in s.losses)  # every step's loss
        assert [p for p, _ in s.probes] == [0, 5, 10, 15]  # the baseline, then the probes after 5, 10, 15 updates
        assert len(s.probes[0][1]["max_score"]) == 2 * 2 and s.final_loss is not None
        assert s.losses[0] == pytest.approx(math.log(104), abs=0.05)  # line 0: the fresh model's loss, before any update
    t = llama[0]
    assert t.history[-1]["step"] == 20 and t.history[-1]["loss"] is None and t.history[-1]["max_score"]  # the trained model's probe
    assert t.results.dtype == "fp32" and t.model["kv_heads"] == 2 and (t.path / rec.WEIGHTS).exists()
    markdown = report.build(tmp_path)["markdown"].read_text(encoding="utf-8")
    assert f"## {warn_section.TITLE}" in markdown and "### The tiny LM" in markdown
    assert f"### The {alarms.FAMILIES['llama']}" in markdown and "warn-curves-llama.png" in markdown


def test_a_record_names_its_family_and_older_ones_are_the_tiny_lm(tmp_path):
    from attnscale.runs import record as rec

    def made(model):
        return rec.TrainRun(tmp_path, rec.Record("train", "done", {"model": {"vocab_size": 8, **model},
                                                                   "train": {"warmup": 7}}, None),
                            rec.TrainResults("done", 0), ())

    assert alarms.family_of(made({"d_model": 64, "norm": "pre"})) == "tiny"
    assert alarms.family_of(made({"d_model": 64, "family": "llama"})) == "llama"
    assert alarms.cell_of(made({"family": "llama"}))["norm"] == "pre-RMSNorm"
    assert alarms.cell_of(made({"norm": "post"}))["norm"] == "post" and alarms.cell_of(made({}))["warmup"] == 7
    assert alarms.analyse([made({"family": "llama"})], None, family="tiny")["rows"] == []


# ---- the analysis on hand-made runs -------------------------------------------------------------


def _made(seed: int, broken: bool, peak: float, lr: float = 0.1):
    """200 steps; a broken run's loss leaves the unigram plateau never (held-out 3.3, floor 3.237: break at 19)
    and its max score reaches ``peak`` at step 10; a healthy one learns (held-out 2.5) and stays at 50."""
    losses = tuple([3.5] * 200) if broken else tuple(4.0 - 1.5 * i / 199 for i in range(200))
    probes = tuple((s, {"max_score": [peak if (broken and s >= 10) else 50.0, 20.0], "effective_words": [3.0, 4.0],
                        "frozen_fraction": [0.0, 0.1]}) for s in range(0, 200, 5))
    series = det.Series(losses, probes, 3.3 if broken else 2.5)
    cell = {"scale": "none", "norm": "post", "warmup": 0, "lr": lr, "seed": seed}
    return alarms.row(cell, f"run-{seed}-{broken}-{lr}", series, floor=3.237)


def _study():
    rows = []
    for seed in range(4):
        rows.append(_made(seed, True, 5000.0))
        rows.append(_made(seed, False, 0.0, lr=0.01))
    return alarms.analyse_rows(rows, floor=3.237)


def test_analysis_chooses_on_half_the_seeds_and_reads_the_other_half():
    result = _study()
    assert result["choosing_seeds"] == (0, 2) and result["held_out_seeds"] == (1, 3)
    assert all(r["break"] == oc.Break(19, "floor") for r in result["rows"] if r["run"].endswith("True-0.1"))
    ms = result["detectors"]["max_score"]["warn"]
    # healthy runs peak at 50: the most hits at no false alarm come first at 100, alarm at step 10, lead 9
    assert ms["parts"] == [("max_score", 100)]
    assert (ms["hits"], ms["broken"], ms["false_alarms"], ms["healthy"]) == (2, 2, 0, 2)
    assert ms["lead_median"] == 9 and ms["lead_share_median"] == pytest.approx(9 / 200)
    assert ms["hit_rate_ci"] == pytest.approx(det.wilson(2, 2)) and ms["false_alarm_rate_ci"] == pytest.approx(det.wilson(0, 2))
    assert result["best"]["parts"] == [("max_score", 100)] and result["combined"] is None
    # the loss never spikes: no warning; max score's lead over it is 9 in every run, an interval of one point
    assert result["detectors"]["loss_spike"]["warn"]["hits"] == 0
    assert result["versus_loss"]["max_score"]["median"] == 9 and result["versus_loss"]["max_score"]["verdict"] == "earlier"
    lines = warn_section.reading(result)
    assert lines[0].startswith("The loss's own spike detector") and "warns 0 of 2" in lines[0]
    assert lines[1].startswith("Best rule of the watch on the choosing seeds: max_score > 100;")
    assert any("stop" in line and "max_score > 100" in line for line in lines)


def test_the_section_draws_its_figures(tmp_path):
    pytest.importorskip("matplotlib")
    pngs = {}
    blocks = warn_section.section(_study(), tmp_path, pngs)
    assert set(pngs) == {"warn-curves", "warn-leads", "warn-example"} and all(p.stat().st_size > 0 for p in pngs.values())
    assert blocks[0].text == warn_section.TITLE


# ---- the watch's defaults are the named run's rule -----------------------------------------------

STUDY = Path(__file__).resolve().parents[2] / "docs" / "warn-study.json"  # the named run's --json
_LIMIT = {"MaxScore": "tau", "Collapsed": "words", "Frozen": "limit", "Spike": "sigmas"}


def test_the_watch_defaults_are_the_studys_rule_with_its_figures():
    """Every family's named run chose the rule default_alerts() is; its docstring points to the study, citing no first-round rate."""
    from attnscale.watch.alerts import Spike, default_alerts

    families = json.loads(STUDY.read_text(encoding="utf-8"))["families"]
    assert set(families) == {"tiny", "llama"}
    alerts = default_alerts()
    got = sorted((type(a).__name__, getattr(a, _LIMIT[type(a).__name__]) if type(a).__name__ in _LIMIT else None)
                 for a in alerts)
    for a in alerts:
        if isinstance(a, Spike):  # the detector's own reading of the alert
            assert (a.measure, a.window, a.min_history, a.direction) == ("max_score", det.SPIKE_WINDOW, det.SPIKE_MIN, "up")
    doc = " ".join(default_alerts.__doc__.split())
    # the first round judged its alerts on runs that never learnt: the docstring cites no rate of it as evidence,
    # and sends the reader to the study's page instead
    assert "docs/warn-study.md" in doc and "healthy runs" not in doc
    for key, study in families.items():
        d = study["default"]
        assert study["family"] == alarms.FAMILIES[key]
        assert got == sorted((alarms.WATCH_ALERTS[n], None if n == "non_finite" else th) for n, th in d["parts"])
        # "stop" only for a rule under 1% false alarms on the held-out seeds
        assert all(a.action == "warn" for a in alerts) or d["false_alarm_rate"] < alarms.STOP_FALSE_ALARMS
        # and they fire on no more than that share of the study's held-out healthy runs, below the target it chose at
        assert d["false_alarm_rate"] <= study["target_false_alarms"] and d["choosing"]["false_alarm_rate"] <= study["target_false_alarms"]


# ---- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--lrs", "0"], "argument --lrs: takes a positive number, got '0'"),
    (["--norm", "mid"], "argument --norm: invalid choice"),
    (["--warmup", "500"], "warm-ups must be whole steps below the run's 200"),
    (["--family", "llama", "--scale", "none"], "--scale and --norm vary the tiny LM only; drop them, or use --family tiny or all"),
    (["--seeds", "0"], "warn-study needs at least 2 seeds, got [0]: half choose the thresholds and the other half judge them"),
    (["--seeds", "3", "3"], "needs at least 2 seeds, got [3]"),
    (["--family", "gpt"], "argument --family: invalid choice"),
    (["--family", "llama", "--dtype", "bf16", "--weights", "bf16"], "set weights to fp32"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path, capsys):
    assert main(["warn-study", "--out", str(tmp_path / "w"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not list(tmp_path.rglob("record.json"))  # refused before any run trained


def test_family_all_varies_the_tiny_lms_scale_and_leaves_the_llama_its_own():
    from attnscale.cli import build_parser
    from attnscale.cli.training import _warn_config

    args = build_parser().parse_args(["warn-study", "--family", "all", "--scale", "none", "--norm", "post", "--quick"])
    tiny, llama = _warn_config(args)
    assert (tiny.family, tiny.scales, tiny.norms) == ("tiny", ("none",), ("post",))
    assert (llama.family, llama.scales, llama.norms) == ("llama", ("inv_sqrt_d",), ("pre",))


@pytest.mark.slow  # the executor path every study shares (tests/runs/test_ray_executor.py): in `make test-all`
@pytest.mark.parametrize("family", ["tiny", "llama"])
def test_the_smoke_study_runs_on_ray(tmp_path, family):
    ray = pytest.importorskip("ray", reason="Ray cannot be imported here: pip install 'attnscale[ray]'")
    from attnscale.runs import record as rec
    from attnscale.runs.ray_connect import start_local

    start_local(num_cpus=2)
    try:
        assert main(["warn-study", "--family", family, "--quick", "--out", str(tmp_path / "w"), "--executor", "ray",
                     "--json"]) == 0
    finally:
        ray.shutdown()
    runs = [rec.TrainRun.load(p) for p in rec.find(tmp_path / "w")]
    assert len(runs) == 4 and all(r.status == "done" and r.record.ray_node for r in runs)
    assert {alarms.family_of(r) for r in runs} == {family}


# ---- the recipe's pilot (issue 42) ----------------------------------------------------------------

LEARNT = [3.0] * 20 + [1.0] * 60  # a 20-step mean under 1.75 from step 32 (13 ones in the window)


def test_the_pilot_is_the_recipe_on_seeds_outside_the_study():
    cfg = ws.pilot_preset()
    t = cfg.train
    assert (t.beta1, t.beta2, t.adam_eps, t.clip, t.weight_decay, t.independent_wd, t.min_lr_ratio) == (
        0.9, 0.95, 1e-8, 1.0, 1e-4, True, 1.0)
    assert t.steps == 1500 and t.record_every == 10 and not set(cfg.seeds) & set(ws.STUDY_SEEDS)
    specs = ws.pilot_specs(cfg, 65)
    assert len(specs) == 2 * 9 * 4 + 9 and len({s.run_id for s in specs}) == len(specs)
    assert {s.model.scale for s in specs} == {"inv_sqrt_d", "uniform"}  # the qk-norm-off arms choose the rungs
    floor = [s for s in specs if s.run_id.startswith("pilot-uniform-")]
    assert [(s.model.scale, s.train.lr, s.train.seed, s.train.z_loss) for s in floor] == [
        ("uniform", lr, 100, 0.0) for lr in ws.PILOT_LRS]  # the no-attention floor, one seed a rung
    s = next(s for s in specs if s.run_id == "pilot-qk-off-z1e-4-lr0.06-seed101")
    assert (s.model.scale, s.model.norm, s.train.z_loss, s.train.lr, s.train.seed, s.train.warmup, s.group) == (
        "inv_sqrt_d", "pre", 1e-4, 0.06, 101, 500, "warn-pilot")
    with pytest.raises(ConfigError, match=r"pilot seeds must lie outside the study's seeds 0–23, got \[3\]"):
        ws.PilotConfig(seeds=(3, 100))
    with pytest.raises(ConfigError, match="unknown pilot arm 'qk-maybe'"):
        ws.PilotConfig(arms=("qk-maybe",))


def test_the_rungs_chosen_are_those_nearest_half_within_thirty_to_seventy_percent():
    assert ws.choose_rungs({0.01: (0, 4), 0.03: (1, 4), 0.1: (2, 4), 0.3: (3, 4)}) == [0.1]  # 25% and 75% are out
    # 30% and 70% are in, both 1/5 from half: the tie goes to the lower rate; 50% first
    assert ws.choose_rungs({0.03: (3, 10), 0.1: (7, 10), 0.3: (5, 10)}) == [0.03, 0.3]
    assert ws.choose_rungs({0.1: (1, 10), 0.3: (0, 0)}) == []


def test_the_pilot_summary_on_hand_made_runs():
    rise = LEARNT + [1.5] * 69  # learns, then breaks at step 80 (tests/analysis/test_outcomes.py)
    rows = [{"arm": "qk-off-z0", "lr": 0.1, "seed": 100, "losses": rise, "final": 1.6},
            {"arm": "qk-off-z0", "lr": 0.1, "seed": 101, "losses": LEARNT + [1.0] * 100, "final": 1.0},
            {"arm": "qk-off-z0", "lr": 0.1, "seed": 102, "losses": [3.0] * 200, "final": 3.0},
            {"arm": "qk-off-z0", "lr": 0.3, "seed": 100, "losses": [3.0] * 100, "final": None},
            {"arm": "qk-off-z1e-4", "lr": 0.1, "seed": 100, "losses": LEARNT + [1.0] * 10 + [None], "final": None},
            {"arm": "qk-on-z0", "lr": 0.1, "seed": 100, "losses": rise, "final": 1.6}]
    got = ws.pilot_summary(rows, bigram=2.5)
    assert got["best"] == 1.0 and got["level"] == pytest.approx(1.75)  # 2.5 − (2.5 − 1.0)/2
    cells = {(c["arm"], c["lr"]): {k: c[k] for k in ("runs", "learned", "mid_run_breaks", "never_learned",
                                                     "degraded")} for c in got["cells"]}
    # qk-off-z0's best rate: medians 1.6 (lr 0.1) and inf (0.3); degraded: above 2.5 or 1.7, or diverged
    assert cells[("qk-off-z0", 0.1)] == {"runs": 3, "learned": 2, "mid_run_breaks": 1, "never_learned": 1, "degraded": 1}
    assert cells[("qk-off-z0", 0.3)] == {"runs": 1, "learned": 0, "mid_run_breaks": 0, "never_learned": 1, "degraded": 1}
    assert cells[("qk-off-z1e-4", 0.1)] == {"runs": 1, "learned": 1, "mid_run_breaks": 1, "never_learned": 0,
                                            "degraded": 1}
    # the qk-norm-off share pools both z-loss arms and leaves the qk-norm arm out: 2 of 4 at 0.1, 0 of 1 at 0.3
    assert {lr: (q["mid_run_breaks"], q["runs"]) for lr, q in got["qk_off"].items()} == {0.1: (2, 4), 0.3: (0, 1)}
    assert got["chosen"] == [0.1]
    text = ws.format_pilot(got)
    # Wilson, 2 of 4: centre 0.5, half-width 1.96·sqrt(1/16 + 3.8415/64)/(1 + 3.8415/4) = 0.350
    assert "2/4 50% [15%, 85%]" in text and "0/1 0% [0%, 79%]" in text and "Rungs for the study: 0.1." in text
    assert "1/3 (1)" in text  # qk-off-z0 at 0.1: one break of three runs, one never learned
    assert "under 1.750 nats" in text


def test_a_pilot_where_nothing_learnt_says_to_change_the_recipe():
    got = ws.pilot_summary([{"arm": "qk-off-z0", "lr": 0.1, "seed": 100, "losses": [3.0] * 50, "final": 3.0}], 2.5)
    assert got["level"] is None and got["chosen"] == []
    assert "no pilot run beat the no-attention floor" in ws.format_pilot(got)


def test_the_uniform_attention_runs_lower_the_floor_and_with_it_the_learned_level():
    rows = [{"arm": "qk-off-z0", "lr": 0.1, "seed": 100, "losses": LEARNT + [1.0] * 100, "final": 1.0},
            {"arm": "uniform", "lr": 0.1, "seed": 100, "losses": [2.2] * 180, "final": 2.1},
            {"arm": "uniform", "lr": 0.3, "seed": 100, "losses": [2.2] * 180, "final": None}]  # diverged: no floor
    got = ws.pilot_summary(rows, bigram=2.5)
    assert (got["uniform"], got["floor"], got["best"]) == (2.1, 2.1, 1.0)
    assert got["level"] == pytest.approx(2.1 - (2.1 - 1.0) / 2)  # from the lower floor, not the bigram's 2.5
    assert got["runs"] == 1 and [c["arm"] for c in got["cells"]] == ["qk-off-z0"]  # the floor runs are no arm
    assert "No-attention floor 2.100 nats (bigram 2.500, uniform attention 2.100)" in ws.format_pilot(got)
    # a bigram below every uniform run keeps the bigram's floor
    assert ws.pilot_summary(rows, bigram=2.0)["floor"] == 2.0


def test_the_smoke_pilot_runs_and_reports(tmp_path, capsys):
    assert main(["warn-study", "--pilot", "--quick", "--out", str(tmp_path / "p"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["runs"] == 4 and got["pilot"] is True  # the two uniform-attention floor runs are not counted
    assert got["bigram"] > 0 and (got["level"] is None) == (got["best"] >= got["bigram"])
    assert sorted(p.name for p in (tmp_path / "p").iterdir() if p.name.startswith("pilot-"))[:1] == [
        "pilot-qk-off-z0-lr0.01-seed100"]


@pytest.mark.parametrize("args, words", [
    (["--seeds", "3"], "pilot seeds must lie outside the study's seeds 0–23"),
    (["--family", "llama"], "--pilot trains the tiny LM's qk-norm-off recipe arms"),
    (["--warmup", "10", "20"], "give --warmup one value"),
])
def test_bad_pilot_input_is_one_line_and_exit_2(args, words, tmp_path, capsys):
    assert main(["warn-study", "--pilot", "--out", str(tmp_path / "p"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_the_readme_and_docs_give_the_recipe_studys_numbers_as_its_record_has_them():
    from attnscale.watch.alerts import NonFinite, default_alerts

    study = json.loads(STUDY.read_text(encoding="utf-8"))["recipe"]
    chosen = study["pilot"]["chosen"]
    cells = [c for c in study["cells"] if c["lr"] in chosen and c["arm"].startswith("qk-off")]
    breaks = sum(c["mid_run_breaks"] for c in cells)
    fa = sorted((c["detectors"]["max_score>1000"]["false_alarms"] for c in cells
                 if c["detectors"]["max_score>1000"]["false_alarms"]["per_1000"] is not None), key=lambda f: f["per_1000"])
    leads = sorted((c["detectors"]["max_score>1000"]["lead"] for c in cells), key=lambda d: d["median"])
    earlier = [c["lr"] for c in cells if c["versus"]["loss_spike"]["max_score>1000"]["holds"]]
    warned = {n: sum(c["detectors"][n]["hits"]["hits"] for c in cells) for n in ("max_score>1000", "loss_spike",
                                                                                  "grad_norm_spike", "log_z_drift")}
    qk_on = [a for name, a in study["arms"].items() if name.startswith("qk-on")]
    def lead(d):  # the interval's ends widened to whole steps, as the report prints them
        return f"{d['median']:g} [{math.floor(d['ci'][0])}, {math.ceil(d['ci'][1])}]"

    def rate(f):
        return f"{f['per_1000']:.2f} [{f['ci'][0]:.2f}, {f['ci'][1]:.2f}]"

    assert (breaks, warned["max_score>1000"], warned["loss_spike"], warned["grad_norm_spike"], warned["log_z_drift"]) \
        == (22, 22, 1, 0, 0)
    assert sum(a["runs"] for a in study["arms"].values()) == 220
    assert [lead(d) for d in (leads[0], leads[-1])] == ["320.5 [135, 390]", "596 [369, 698]"]  # docs/warn-study.md's
    assert [rate(f) for f in (fa[0], fa[-1])] == ["1.39 [1.32, 1.50]", "1.80 [1.69, 1.93]"]
    assert earlier == [0.08, 0.08] and sum(a["mid_run_breaks"] for a in qk_on) == 0
    quiet = [c["detectors"][n]["false_alarms"] for c in study["cells"] if c["lr"] in chosen and c["arm"].startswith("qk-on")
             for n in ("max_score>100", "max_score>1000", "max_score>10000", "max_score", "entropy_collapse")]
    assert len(quiet) == 20 and {f["false_alarms"] for f in quiet} == {0}
    assert {tuple(round(x, 2) for x in f["ci"]) for f in quiet} == {(0.0, 0.17)}
    # the defaults follow from the rule applied to these numbers
    assert study["verdict"]["defaults"] == [] and [type(a) for a in default_alerts()] == [NonFinite]


def test_default_alerts_says_what_the_alarm_meant_and_what_acting_did_as_the_act_study_has_it():
    """default_alerts, each figure from docs/warn-study.json's "act" and the published series: every learned run
    of arm A broke, acting stopped every break, and B and C ended the same distance above qk-norm (C − B itself
    is re-derived in tests/test_act_study_figures.py); the README links the study (its advice now quotes the
    alarm study's numbers, tests/experiments/test_alarm_study.py)."""
    import gzip

    act = json.loads(STUDY.read_text(encoding="utf-8"))["act"]
    series = json.loads(gzip.decompress((STUDY.parent / "act-study-series.json.gz").read_bytes()))
    readme = " ".join((STUDY.parents[1] / "README.md").read_text(encoding="utf-8").split())
    a = [r for r in series["runs"] if r["arm"] == "A" and r["outcome"]["learned_at"] is not None]
    assert all(r["outcome"]["break_step"] is not None for r in a)  # every learned run of arm A broke
    assert act["level"] == 1e4
    acting = [act["arms"][k] for k in ("B", "C", "D")]
    b = {(x["breaks_vs_A"]["b"], x["breaks_vs_A"]["c"], x["breaks_vs_A"]["p"]) for x in acting}
    assert len(b) == 1 and act["arms"]["A"]["mid_run_breaks"] == next(iter(b))[0]
    (n, _, p), = b
    pairs = acting[0]["breaks_vs_A"]["pairs"]
    clip = {f"{act['arms'][k]['loss_vs_E']['diff']:.2f}" for k in ("B", "C")}
    assert clip == {"0.16"} and not act["interim"]  # B and C the same distance above qk-norm, to 0.01 nats
    assert "[act](docs/act-study.md)" in readme  # the README's advice is the alarm study's, and links this one
    from attnscale.watch.alerts import default_alerts

    lo, hi = min(x["loss_vs_E"]["diff"] for x in acting), max(x["loss_vs_E"]["diff"] for x in acting)
    doc = " ".join(default_alerts.__doc__.split())  # default_alerts says the same, in its own words
    assert f"stopped all {n} breaks of the act study's {pairs} paired seeds" in doc
    assert f"ended {lo:.2f}-{hi:.2f} nats above qk-norm" in doc and p < 1e-7
