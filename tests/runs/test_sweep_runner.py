"""The sweep runner: resume without redoing or duplicating, refuse mixed folders,
survive divergence, run in parallel workers, and survive SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from attnscale.runs import record
from attnscale.errors import ConfigError
from attnscale.runs.progress import Live, Plain, Silent, make_progress
from attnscale.runs.runner import CorpusSpec, RunSpec, cores, execute

from specs import CORPUS, corpus, spec  # noqa: F401  (corpus: the module-scoped fixture)


def steps_logged(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def assert_clean(run_dir: Path) -> None:
    """A finished run: a readable record, a log whose steps are all distinct and increasing."""
    assert record.read(run_dir).status in record.FINISHED
    steps = steps_logged(run_dir)
    assert steps == sorted(set(steps)), steps


def test_trains_every_run_then_keeps_them(tmp_path, corpus):
    specs = [spec(corpus, 8, "none"), spec(corpus, 8, "inv_sqrt_d")]
    records = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert [r.status for r in records] == ["done", "done"]
    assert [r.run_id for r in records] == ["d8-none-s0", "d8-inv_sqrt_d-s0"]
    assert records[0].group == "test" and records[0].head_dim == 8
    for s in specs:
        assert_clean(tmp_path / s.run_id)
        assert steps_logged(tmp_path / s.run_id) == [0, 4, 8]
    before = {s.run_id: (tmp_path / s.run_id / "record.json").stat().st_mtime_ns for s in specs}
    again = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert {s.run_id: (tmp_path / s.run_id / "record.json").stat().st_mtime_ns for s in specs} == before
    assert [r.perplexity for r in again] == [r.perplexity for r in records]


def test_a_run_cut_short_says_from_which_step_it_resumes(tmp_path, corpus, capsys):
    """Rerun after Ctrl-C, a run said only "training 8 steps" and went on from its checkpoint unannounced."""
    from attnscale.runs.trainer import train_run

    s = spec(corpus, checkpoint_every=2)
    done = []
    train_run(s.model, s.train, corpus, tmp_path / s.run_id, group=s.group, should_stop=lambda: len(done) >= 5,
              on_step=lambda *a: done.append(a))
    capsys.readouterr()
    [rec] = execute([s], CORPUS, tmp_path, progress=True, corpus=corpus)
    err = capsys.readouterr().err
    assert rec.status == "done" and rec.record.results["resumed_from"] == 4
    assert f"attnscale: {s.run_id}: resuming from step 4 of 8 (its checkpoint)" in err.splitlines()


def test_half_finished_run_restarts_with_a_fresh_log(tmp_path, corpus):
    s = spec(corpus)
    run_dir = tmp_path / s.run_id
    execute([s], CORPUS, tmp_path, progress=False, corpus=corpus)
    done = record.TrainRun.load(run_dir)
    # what a killed run leaves: a "running" record and part of a log
    record.write(run_dir, record.new("train", done.record.config, None, status="running"))
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 4}\n{"st')
    [rec] = execute([s], CORPUS, tmp_path, progress=False, corpus=corpus)
    assert rec.status == "done"
    assert steps_logged(run_dir) == [0, 4, 8]
    assert rec.perplexity == done.perplexity  # same seed, same numbers


def test_a_damaged_record_on_resume_is_set_aside_and_the_run_trained_again(tmp_path, corpus, capsys):
    specs = [spec(corpus, 8, "none"), spec(corpus, 8, "inv_sqrt_d")]
    execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    damaged = tmp_path / specs[1].run_id
    (damaged / "record.json").write_text('{"schema": 2, "experiment": "tr')  # a record cut short by a failing disk
    kept = {name: (damaged / name).read_bytes() for name in ("record.json", "metrics.jsonl", "model.safetensors")}
    capsys.readouterr()
    records = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert [r.status for r in records] == ["done", "done"]
    assert {name: (damaged / f"{name}.damaged-1").read_bytes() for name in kept} == kept
    assert_clean(damaged)
    assert "set aside as metrics.jsonl.damaged-1, model.safetensors.damaged-1, record.json.damaged-1" in capsys.readouterr().err


def test_folder_of_another_config_stops_before_any_training(tmp_path, corpus):
    execute([spec(corpus, 8)], CORPUS, tmp_path, progress=False, corpus=corpus)
    record = tmp_path / "d8-none-s0" / "record.json"
    before = record.read_bytes()
    other = [spec(corpus, 16), spec(corpus, 8, steps=9)]  # the first is new, the second clashes
    with pytest.raises(ConfigError, match="another --out"):
        execute(other, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert record.read_bytes() == before
    assert not (tmp_path / "d16-none-s0").exists()


def test_diverged_run_does_not_stop_the_sweep_and_is_not_redone(tmp_path, corpus):
    specs = [spec(corpus, 8, lr=1e6, clip=1e9), spec(corpus, 8, "inv_sqrt_d")]
    records = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert [r.status for r in records] == ["diverged", "done"]
    mtime = (tmp_path / specs[0].run_id / "record.json").stat().st_mtime_ns
    execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert (tmp_path / specs[0].run_id / "record.json").stat().st_mtime_ns == mtime


def test_duplicate_ids_and_short_corpus_are_config_errors(tmp_path, corpus):
    s = spec(corpus)
    with pytest.raises(ConfigError, match="unique"):
        execute([s, s], CORPUS, tmp_path, progress=False, corpus=corpus)
    short = tmp_path / "short.txt"
    short.write_text("a tiny text, far shorter than the context asks\n" * 2)
    small = CorpusSpec(str(short))
    tiny_corpus = small.load()
    from dataclasses import replace

    long_ctx = replace(s, model=replace(s.model, vocab_size=max(tiny_corpus.vocab_size, 1), context=64))
    with pytest.raises(ConfigError, match="context"):
        execute([long_ctx], small, tmp_path / "o", progress=False)
    with pytest.raises(ConfigError, match="jobs"):
        execute([s], CORPUS, tmp_path, jobs=0, progress=False, corpus=corpus)


def test_reuse_copies_a_finished_run_of_the_same_config(tmp_path, corpus):
    s = spec(corpus)
    [first] = execute([s], CORPUS, tmp_path / "a", progress=False, corpus=corpus)
    other_group = RunSpec(s.run_id, s.model, s.train, "sweep")
    [copied] = execute([other_group], CORPUS, tmp_path / "b", progress=False, corpus=corpus, reuse=[tmp_path / "a"])
    assert copied.group == "sweep" and copied.record.copied_from == str(tmp_path / "a" / s.run_id)
    assert copied.results == first.results and first.group == "test"
    # the copy is a whole run: its final weights came along
    assert (tmp_path / "b" / s.run_id / "model.safetensors").read_bytes() == (
        tmp_path / "a" / s.run_id / "model.safetensors").read_bytes()
    assert steps_logged(tmp_path / "b" / s.run_id) == [0, 4, 8]


def test_runs_start_dearest_first_and_records_keep_the_order_given(tmp_path, corpus, monkeypatch):
    from attnscale.runs import runner

    started = []
    real = runner.train_run
    monkeypatch.setattr(runner, "train_run",
                        lambda m, t, *a, **k: (started.append((m.head_dim, t.steps)), real(m, t, *a, **k))[1])
    # narrow first, as a sweep lists them. A step costs more the wider its heads (all else equal), and a
    # run of 3× the steps at width 8 costs more than one at 32: the embeddings and output layer, the same at
    # every width, are most of a step this small (2.75 and 4.52 million operations a step at widths 8 and 32)
    specs = [spec(corpus, 8, "none"), spec(corpus, 32, "none"), spec(corpus, 16, "none"),
             spec(corpus, 8, "inv_sqrt_d", steps=24)]
    records = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus)
    assert started == [(8, 24), (32, 8), (16, 8), (8, 8)]
    assert [r.run_id for r in records] == [s.run_id for s in specs]
    assert runner.longest_first(specs[:3], {s.run_id: 1.0 for s in specs}) == specs[:3]  # ties keep their order


def test_keep_order_starts_runs_as_given_and_a_watch_travels_to_the_worker(tmp_path, corpus, monkeypatch):
    from dataclasses import replace

    from attnscale.lm.checkpoint import run_config
    from attnscale.runs import runner

    started = []
    real = runner.train_run
    monkeypatch.setattr(runner, "train_run",
                        lambda m, t, *a, **k: (started.append((m.head_dim, t.steps, k.get("watch"))),
                                               real(m, t, *a, **k))[1])
    watch = {"every": 4, "probe": "records", "qk_clip": 100.0}  # a probe at every record step
    specs = [spec(corpus, 8, "none"), replace(spec(corpus, 16, "none", steps=24), watch=watch)]
    records = execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus, keep_order=True)
    assert started == [(8, 8, None), (16, 24, watch)]  # not dearest first
    # a run without a watch keeps the config runs always had; one with a watch keeps it in its record
    assert records[0].record.config == json.loads(json.dumps(run_config(specs[0].model, specs[0].train, corpus)))
    assert records[1].record.config["watch"] == watch
    # resumed: both found finished, nothing trained again; the same run with another watch is another config
    started.clear()
    execute(specs, CORPUS, tmp_path, progress=False, corpus=corpus, keep_order=True)
    assert started == []
    with pytest.raises(ConfigError):
        execute([replace(specs[1], watch={**watch, "qk_clip": 50.0})], CORPUS, tmp_path, progress=False, corpus=corpus)
    with pytest.raises(ConfigError, match="a run's watch takes every, probe, qk_clip, alerts"):
        execute([replace(specs[0], run_id="bad", watch={"tau": 1})], CORPUS, tmp_path, progress=False, corpus=corpus)
    # a records probe off the record steps (every 3, records every 4) could not probe what the records measure
    with pytest.raises(ConfigError, match="every=3 must be a multiple of record_every=4"):
        execute([replace(specs[0], run_id="bad", watch={**watch, "every": 3})], CORPUS, tmp_path, progress=False,
                corpus=corpus)
    assert not (tmp_path / "bad").exists()  # refused before any folder was written


def test_parallel_workers_give_the_same_runs(tmp_path, corpus):
    specs = [spec(corpus, 8, "none"), spec(corpus, 8, "inv_sqrt_d"), spec(corpus, 16, "none")]
    records = execute(specs, CORPUS, tmp_path, jobs=2, progress=False, corpus=corpus)
    assert [r.status for r in records] == ["done"] * 3
    assert all(r.results.threads == max(1, cores() // 2) for r in records)  # the cores shared by 2 workers
    for s in specs:
        assert_clean(tmp_path / s.run_id)
    serial = execute(specs[:1], CORPUS, tmp_path / "serial", progress=False, corpus=corpus)
    assert records[0].perplexity == pytest.approx(serial[0].perplexity, rel=1e-3)


def test_progress_kinds(tmp_path, capsys, monkeypatch):
    kw = dict(total_runs=2, total_steps=20, done_runs=1, done_steps=10, out=tmp_path)
    assert type(make_progress(False, **kw)) is Silent
    bar = make_progress(True, **kw)  # pytest's stderr is not a terminal: plain lines
    assert type(bar) is Plain
    bar.start("d8-none-s0", 10)
    bar.step("d8-none-s0", 1, 1.0)  # a fresh run's first report is its step 1
    bar.step("d8-none-s0", 5, 1.0)
    bar.finish("d8-none-s0", {"status": "diverged", "valid_ppl": None, "duration_s": 3.0})
    err = capsys.readouterr().err
    assert "1 of 2 runs already finished" in err and "[2/2] d8-none-s0: diverged" in err
    assert bar.done_steps == 15 and bar.seconds_left() == 0  # a diverged run's unused steps are not waited for
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    live = make_progress(True, **kw)
    assert type(live) is Live
    live.start("a", 10)
    live.step("a", 10, 0.5)
    live.finish("a", {"status": "done", "valid_ppl": 2.0, "duration_s": 1.0})
    live.close()


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    torch.set_num_threads(1)
    from attnscale.experiments import sweep
    from attnscale.lm.train import TrainConfig
    cfg = sweep.SweepConfig(head_dims=(8, 16), scales=("none", "inv_sqrt_d"),
                            model={"context": 16, "d_model": 16, "n_layers": 1, "n_heads": 2},
                            train=TrainConfig(steps=150, batch=4, warmup=5, record_every=5, eval_batches=2))
    sweep.run(cfg, sys.argv[1], jobs=1, progress=False)
""")


def _state(out: Path) -> dict[str, str]:
    states = {}
    for d in out.glob("d*"):
        try:
            states[d.name] = record.read(d).status
        except record.RecordError:
            pass
    return states


def test_sigkill_mid_sweep_then_rerun_loses_and_redoes_nothing(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-c", SWEEP_SCRIPT, str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            states = _state(out)
            running = [r for r, s in states.items() if s == "running"]
            log = out / running[0] / "metrics.jsonl" if running else None
            if "done" in states.values() and log is not None and log.exists() and log.read_text().count("\n") >= 2:
                break  # one run finished, another has logged steps and is still going
            assert proc.poll() is None, f"sweep ended before it could be killed: {proc.stderr.read().decode()}"
            time.sleep(0.01)
        else:
            pytest.fail("no run finished within 120 s")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed = _state(out)
    finished = {r for r, s in killed.items() if s == "done"}
    half = {r for r, s in killed.items() if s == "running"}
    assert finished and half
    kept = {r: ((out / r / "record.json").read_bytes(), (out / r / "record.json").stat().st_mtime_ns) for r in finished}

    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    after = _state(out)
    assert sorted(after) == sorted(["d8-none-s0", "d8-inv_sqrt_d-s0", "d16-none-s0", "d16-inv_sqrt_d-s0"])
    assert set(after.values()) == {"done"}
    for r, (content, mtime) in kept.items():  # not lost, not redone
        assert (out / r / "record.json").read_bytes() == content
        assert (out / r / "record.json").stat().st_mtime_ns == mtime
    for r in after:
        assert_clean(out / r)
        assert steps_logged(out / r) == list(range(0, 151, 5))
    assert not list(out.rglob("*.tmp"))


def test_ctrl_c_with_workers_keeps_finished_runs_and_leaves_no_worker(tmp_path):
    # six runs on two workers, so that once the first is done at least four are left to be interrupted, even where
    # the longest start first and the shortest end together; 300 steps (about a second a run here) leave the poll
    # below 4 s between the first run done and the last, where 40 steps left 0.75 s and a loaded machine missed it
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "attnscale.cli", "sweep", "--widths", "8", "16", "32", "--scale", "none", "inv_sqrt_d",
           "--quick", "--steps", "300", "--batch", "2", "--context", "16", "--out", str(out), "-j", "2"]
    # a shell that starts the tests in the background (`cmd &`) leaves SIGINT ignored, and a child inherits that:
    # the sweep gets Ctrl-C's default, as it would from a terminal
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while "done" not in _state(out).values():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "finished runs are kept" in err and "Traceback" not in err
    stopped = _state(out)
    logs = {r: (out / r / "metrics.jsonl").read_bytes() for r in stopped if (out / r / "metrics.jsonl").exists()}
    time.sleep(2)  # no orphaned worker goes on writing
    assert logs == {r: (out / r / "metrics.jsonl").read_bytes() for r in logs}
    finished = {r for r, s in stopped.items() if s == "done"}
    kept = {r: (out / r / "record.json").read_bytes() for r in finished}
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    # the six pairs and the sweep's uniform floor, at its narrowest width where it has no 128
    assert set(_state(out).values()) == {"done"} and sorted(_state(out)) == sorted(
        [f"d{w}-{s}-s0" for w in (8, 16, 32) for s in ("none", "inv_sqrt_d")] + ["d8-uniform-s0"])
    assert kept == {r: (out / r / "record.json").read_bytes() for r in finished}
