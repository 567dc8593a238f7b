"""The full-length preset (`reproduce --full`): its budget, checkpoints and ETA, validated without training it."""

from dataclasses import asdict

import pytest

from attnscale import limits, reproduce
from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.experiments import dynamics, sweep
from attnscale.lm.presets import CHECKPOINT_EVERY, FULL_SEEDS, FULL_STEPS, budget, preset_name
from attnscale.runs.pace import Pace
from attnscale.runs.runner import estimate

BUDGET_MIN = 90  # the full preset's promise on a 2-core laptop CPU with -j 2
REFERENCE = Pace(0.0, 1 / limits.CPU_OPS_PER_S)  # the reference CPU's measured rate: what the budgets are held to


def _eta(stage, tmp_path):
    return reproduce._left_s(stage, tmp_path / "nothing-here" / stage.folder, REFERENCE)


def test_full_is_the_default_setup_trained_longer_with_seeds():
    full, default = budget("full"), budget("default")
    assert full.model == default.model
    f, d = asdict(full.train), asdict(default.train)
    assert f.pop("steps") == FULL_STEPS > d.pop("steps") and full.seeds == FULL_SEEDS >= 2
    assert f == d  # lr, schedule, weight decay, warm-up, recording: the default's, so the study's rows compare
    assert full.train.checkpoint_every == CHECKPOINT_EVERY and FULL_STEPS // CHECKPOINT_EVERY >= 10


def test_one_preset_at_a_time():
    assert [preset_name(), preset_name(quick=True), preset_name(full=True)] == ["default", "quick", "full"]
    with pytest.raises(ConfigError, match="--quick and --full"):
        preset_name(True, True)


@pytest.mark.parametrize("command", [["reproduce"], ["sweep"], ["dynamics"], ["train"]])
def test_quick_and_full_together_are_one_line_and_write_nothing(command, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*command, "--quick", "--full", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--quick and --full" in err and not out.exists()


def test_full_stages_fit_the_budget_and_checkpoint_every_run(tmp_path):
    todo = reproduce.stages(preset="full", jobs=2)
    names = [s.name for s in todo]
    assert sum("training dynamics" in n for n in names) == FULL_SEEDS  # one dynamics pair per seed
    total = sum(_eta(s, tmp_path) for s in todo)
    assert 20 * 60 < total <= BUDGET_MIN * 60, total / 60
    dyn = [s.config for s in todo if s.folder == "dynamics"]
    swp = next(s.config for s in todo if s.folder == "sweep")
    assert sorted(c.seed for c in dyn) == list(swp.seeds) == list(range(FULL_SEEDS))
    for cfg in (*dyn, swp):
        assert cfg.train.steps == FULL_STEPS and cfg.train.checkpoint_every == CHECKPOINT_EVERY
    # the sweep's widest pairs are the dynamics runs: the ETA counts them once
    assert next(_eta(s, tmp_path) for s in todo if s.folder == "sweep") == pytest.approx(
        estimate([s for s in sweep.specs(swp, 104) if s.model.head_dim != 1024]).ops / (2 * limits.CPU_OPS_PER_S))


def test_the_work_counted_matches_what_the_reference_cpu_took(tmp_path):
    """The default preset's work at the reference CPU's rate against what its named run took
    there (dynamics 236 s, sweep 243 s with -j 2): operations are the right unit of work."""
    todo = {s.folder: _eta(s, tmp_path) for s in reproduce.stages(preset="default", jobs=2)}
    assert 0.8 * 236 < todo["dynamics"] < 1.25 * 236 and 0.8 * 243 < todo["sweep"] < 1.25 * 243
    cfg = dynamics.preset(full=True, vocab_size=104)
    specs = dynamics.specs(cfg, 104)
    assert REFERENCE.seconds(specs, 1) == pytest.approx(2 * REFERENCE.seconds(specs, 2))
    assert REFERENCE.seconds(specs, 1) == pytest.approx(estimate(specs).ops / limits.CPU_OPS_PER_S)


def test_reproduce_prints_its_estimate_before_the_first_stage(tmp_path, capsys, monkeypatch):
    """The ETA line comes first, then each stage with the time left."""
    calls = []

    def boom(cfg, d):
        calls.append(d)
        raise KeyboardInterrupt("Ctrl-C in the first run")

    stages = reproduce.stages(preset="full", jobs=2)
    monkeypatch.setattr(reproduce, "stages", lambda **kw: [stages[0].__class__(**{**stages[0].__dict__, "runner": boom})])
    with pytest.raises(KeyboardInterrupt, match="Ctrl-C in the first run"):
        reproduce.run(tmp_path / "out", preset="full", jobs=2)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("attnscale reproduce, full preset: 1 stage, about 2 s of work left with 2 jobs "
                             "at the pace of this machine (nothing left to train")
    assert err[1].startswith("[1/1] spread of q·k vs width (about 2 s; 2 s left in all) ...") and calls


def test_dynamics_and_sweep_take_the_full_budget():
    d = dynamics.preset(full=True, vocab_size=104)
    s = sweep.preset(full=True, vocab_size=104, seed=3)
    assert d.train.steps == s.train.steps == FULL_STEPS and s.seeds == tuple(range(3, 3 + FULL_SEEDS))
    assert sweep.preset(vocab_size=104).seeds == (0,)


def test_the_eta_leaves_out_runs_already_finished(tmp_path):
    """A rerun of a reproduce whose runs are on disk is told it has (almost) nothing left."""
    from attnscale.runs import record as rec

    stage = next(s for s in reproduce.stages(preset="full", jobs=2) if s.folder == "sweep")
    folder = tmp_path / "sweep"
    full = reproduce._left_s(stage, folder, REFERENCE)
    ops = {s.run_id: estimate([s]).ops for s in stage.runs}
    for s in stage.runs[:-1]:  # all but the last run finished
        rec.write(folder / s.run_id, rec.new("train", {}, {"status": "done", "steps_done": 1}))
    last = stage.runs[-1].run_id
    assert reproduce._left_s(stage, folder, REFERENCE) == pytest.approx(full * ops[last] / sum(ops.values()))
    rec.write(folder / last, rec.new("train", {}, {"status": "running", "steps_done": 0}, status="running"))
    assert reproduce._left_s(stage, folder, REFERENCE) == pytest.approx(full * ops[last] / sum(ops.values()))


def test_dtype_reaches_every_training_stage_and_only_them():
    for dtype in ("fp32", "bf16"):
        todo = reproduce.stages(preset="quick", jobs=1, dtype=dtype)
        trained = [s for s in todo if s.group]
        assert {s.folder for s in trained} == {"dynamics", "sweep", "schemes"}
        assert {r.train.dtype for s in trained for r in s.runs} == {dtype}
    assert {r.train.dtype for s in reproduce.stages(preset="quick", jobs=1) if s.group for r in s.runs} == {"auto"}
