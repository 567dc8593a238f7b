"""runs.pace: the rate every ETA comes from, measured on this machine, in operations of work."""

from dataclasses import replace
from functools import partial

import pytest

from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig
from attnscale.runs import pace
from attnscale.runs.pace import Pace
from attnscale.runs.runner import CorpusSpec, estimate
from specs import corpus  # noqa: F401  (the module-scoped fixture)
from specs import spec as shared_spec


# The pace names its runs "none" but builds them at the model's default scale, and ends without a test group.
spec = partial(shared_spec, base=TrainConfig(steps=20, batch=4, warmup=1, eval_batches=1), group=None,
               model_scale=ModelConfig.scale)


def test_work_is_counted_in_operations_so_a_wide_step_weighs_more(corpus):
    narrow, wide = spec(corpus, 8), spec(corpus, 256)
    assert pace.step_ops(wide) > 5 * pace.step_ops(narrow)
    assert pace.run_cost(narrow).ops == pytest.approx(20 * pace.step_ops(narrow))
    assert estimate([narrow, wide]).ops == pytest.approx(pace.run_cost(narrow).ops + pace.run_cost(wide).ops)


def test_measure_times_real_steps_and_writes_nothing(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    measured = pace.measure([spec(corpus, 8), spec(corpus, 256)], corpus, threads=1, steps=2)
    assert measured.timed == ("d256-none-s0", "d8-none-s0") and list(tmp_path.iterdir()) == []
    assert 0 < measured.run_seconds(spec(corpus, 8)) < measured.run_seconds(spec(corpus, 256)) < 3600


def test_timing_stops_after_the_timed_steps(corpus, monkeypatch):
    from attnscale.lm import train as train_mod

    steps_run = []
    real = train_mod.train

    def counting(model_cfg, train_cfg, corpus, *, on_step=None, should_stop=None, **kw):
        def on(step, total, info):
            steps_run.append(step)
            on_step(step, total, info)
        assert train_cfg.threads == 1 and train_cfg.checkpoint_every == 0
        return real(model_cfg, train_cfg, corpus, on_step=on, should_stop=should_stop, **kw)

    monkeypatch.setattr(train_mod, "train", counting)
    assert pace._step_seconds(spec(corpus, steps=400), corpus, threads=1, steps=2) > 0
    assert steps_run == [1, 2, 3]  # one warm-up step, then the two timed ones; not the run's 400


def test_a_line_through_the_dear_and_the_cheap_step(corpus, monkeypatch):
    narrow, wide = spec(corpus, 8), spec(corpus, 256)
    o_narrow, o_wide = pace.step_ops(narrow), pace.step_ops(wide)
    # a step costs 5 ms plus 1 ns per operation
    monkeypatch.setattr(pace, "_step_seconds", lambda s, *a, **k: 5e-3 + pace.step_ops(s) * 1e-9)
    fitted = pace.measure([narrow, wide], corpus, threads=1)
    assert fitted.step_s == pytest.approx(5e-3) and fitted.op_s == pytest.approx(1e-9)
    assert fitted.run_seconds(narrow) == pytest.approx(20 * (5e-3 + o_narrow * 1e-9))
    # noise that makes the cheap step dearer: all of the dear step's time is put on its operations
    monkeypatch.setattr(pace, "_step_seconds", lambda s, *a, **k: 0.5 if s is narrow else 0.2)
    fallback = pace.measure([narrow, wide], corpus, threads=1)
    assert fallback.step_s == 0 and fallback.op_s == pytest.approx(0.2 / o_wide)


def test_the_estimate_follows_what_the_runs_took(corpus):
    p = Pace(step_s=0.0, op_s=1e-9)
    runs = [spec(corpus, 256), spec(corpus, 256)]
    predicted = p.seconds(runs, workers=2)
    assert predicted == pytest.approx(sum(p.run_seconds(s) for s in runs) / 2)
    for s in runs:  # the machine turned out three times slower
        p.observe(p.run_seconds(s), 3 * p.run_seconds(s))
    assert p.factor() == pytest.approx(3.0)
    assert p.seconds(runs[:1], workers=1) == pytest.approx(3 * p.run_seconds(runs[0]))
    p.observe(0.0, 5.0)  # a run that trained no step (all copied, or failed at once) says nothing
    assert p.factor() == pytest.approx(3.0)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_loaded_machine_corrects_the_estimate_after_its_first_run(corpus):
    """The pace was timed on an idle machine; then other work takes 60% of it, so every step
    takes 2.5 times as long. After the first run ends, the estimate of the rest (the next
    stage's ETA) is within 30% of what they will take; before it, it is 60% short."""
    from attnscale.runs.progress import make_progress

    p = Pace(step_s=0.05, op_s=1e-9)
    runs = [replace(spec(corpus, w, steps=40), run_id=f"r{i}") for i, w in enumerate((8, 64, 256, 64))]
    slow = 2.5
    truth = sum(slow * p.run_seconds(s) + 1.0 for s in runs[1:])  # each run also spends 1 s starting and evaluating
    assert p.seconds(runs[1:]) < 0.7 * truth  # the uncorrected estimate: far too short
    clock = FakeClock()
    weights = {s.run_id: p.step_seconds(s) for s in runs}
    bar = make_progress(False, total_runs=4, total_steps=160, done_runs=0, done_steps=0, out=None,
                        weights=weights, pace=p, clock=clock)
    first = runs[0]
    bar.start(first.run_id, 40)
    for step in range(1, 41):
        clock.now += slow * p.step_seconds(first)
        bar.step(first.run_id, step)
    clock.now += 1.0
    bar.finish(first.run_id, {"status": "done"})
    assert p.seconds(runs[1:]) == pytest.approx(truth, rel=0.3)
    # the run's own estimate weighed its steps: the factor is what it took over what was predicted
    assert p.factor() == pytest.approx(clock.now / p.run_seconds(first))


def test_a_resumed_run_is_judged_on_the_steps_it_trained_here(corpus):
    from attnscale.runs.progress import make_progress

    p = Pace(step_s=0.1, op_s=0.0)
    clock = FakeClock()
    bar = make_progress(False, total_runs=1, total_steps=100, done_runs=0, done_steps=0, out=None,
                        weights={"r": 0.1}, pace=p, clock=clock)
    bar.start("r", 100)
    for step in range(91, 101):  # a checkpoint held the first 90 steps
        clock.now += 0.2
        bar.step("r", step)
    bar.finish("r", {"status": "done"})
    assert p.predicted_s == pytest.approx(10 * 0.1) and p.actual_s == pytest.approx(2.0)


def test_the_runs_time_left_weighs_steps_as_the_stage_estimate_does(corpus, tmp_path, monkeypatch):
    from attnscale.runs import runner
    from attnscale.runs.progress import make_progress

    seen = {}

    def capture(enabled, **kw):
        seen.update(kw)
        return make_progress(False, **kw)

    monkeypatch.setattr(runner, "make_progress", capture)
    p = Pace(step_s=0.5, op_s=1e-9)
    runs = [replace(spec(corpus, 8, steps=2), run_id="a"), replace(spec(corpus, 64, steps=2), run_id="b")]
    runner.execute(runs, CorpusSpec("default"), tmp_path, progress=False, corpus=corpus, pace=p)
    assert seen["weights"] == {"a": p.step_seconds(runs[0]), "b": p.step_seconds(runs[1])}
    assert seen["total_work"] == pytest.approx(2 * p.step_seconds(runs[0]) + 2 * p.step_seconds(runs[1]))
    assert sum(p.run_seconds(s) for s in runs) == pytest.approx(seen["total_work"])
