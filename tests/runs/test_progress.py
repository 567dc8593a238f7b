"""runs.progress: the time left counts work, a log hears from a long run about once a minute,
and copied runs are called copies, with the stage they come from."""

import pytest

from attnscale.runs.progress import Plain, Silent


def test_time_left_counts_work_not_steps(tmp_path):
    now = [0.0]
    # a cheap run of 100 steps (1 unit each) and a dear one of 100 steps (9 units each)
    bar = Silent(total_runs=2, total_steps=200, done_runs=0, done_steps=0, out=tmp_path,
                 weights={"narrow": 1.0, "wide": 9.0}, total_work=1000.0, done_work=0.0, clock=lambda: now[0])
    bar.start("narrow", 100)
    bar.step("narrow", 1)  # a run's first report is its first step (past a checkpoint's, where it resumed)
    now[0] = 10.0
    bar.step("narrow", 100)
    # 100 units in 10 s: 900 left take 90 s (counting steps would say 10 s)
    assert bar.seconds_left() == pytest.approx(90.0)


def test_a_log_hears_from_a_long_run_about_once_a_minute(tmp_path, capsys):
    now = [0.0]
    bar = Plain(total_runs=1, total_steps=1200, done_runs=0, done_steps=0, out=tmp_path, clock=lambda: now[0])
    bar.start("d1024-none-s0", 1200)
    capsys.readouterr()
    for step in range(1, 1200):  # up to 299.75 s
        now[0] = step * 0.25  # a step every quarter second: 300 s in all
        bar.step("d1024-none-s0", step)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4  # at 60, 120, 180 and 240 s; nothing in between
    assert lines[0].startswith("attnscale: [0/1] d1024-none-s0 step 240/1200; about 4 min 00 s left"), lines[0]


def test_copies_are_called_copies_and_say_which_stage_trained_them(tmp_path, capsys):
    dynamics = tmp_path / "out" / "dynamics"
    Plain(total_runs=12, total_steps=12, done_runs=3, done_steps=3, out=tmp_path / "out" / "sweep",
          copied={"d1024-none-s0": dynamics, "d1024-inv_sqrt_d-s0": dynamics})
    err = capsys.readouterr().err.splitlines()
    assert err == [f"attnscale: 2 of 12 runs are copies of runs the dynamics stage trained ({dynamics}): "
                   "same config, not trained again",
                   f"attnscale: 1 of 12 runs already finished in {tmp_path / 'out' / 'sweep'}; they are kept"]


def test_a_resumed_run_says_from_which_step_once_and_a_fresh_one_says_nothing(tmp_path, capsys):
    bar = Plain(total_runs=2, total_steps=6000, done_runs=0, done_steps=0, out=tmp_path)
    bar.start("resumed", 3000)
    bar.start("fresh", 3000)
    capsys.readouterr()
    for step in (1001, 1002):  # a checkpoint held the first 1,000 steps
        bar.step("resumed", step)
    bar.step("fresh", 1)
    bar.step("fresh", 2)
    assert capsys.readouterr().err.splitlines() == ["attnscale: resumed: resuming from step 1,000 of 3,000 (its checkpoint)"]


def test_a_resumed_runs_checkpointed_steps_are_work_done_not_work_trained_now(tmp_path):
    """3,000 steps, a checkpoint of 1,000: its steps are done before this process started, so 100 steps trained
    in 10 s leave 1,899 to train at about 10 a second, about 188 s (counting the checkpoint as trained now, 1,101
    steps in 10 s, said about 17 s)."""
    now = [0.0]
    bar = Silent(total_runs=1, total_steps=3000, done_runs=0, done_steps=0, out=tmp_path, clock=lambda: now[0])
    bar.start("resumed", 3000)
    bar.step("resumed", 1001)
    now[0] = 10.0
    bar.step("resumed", 1101)
    assert bar.done_steps == 1000 and bar.seconds_left() == pytest.approx(1899 / (101 / 10.0))
    bar.finish("resumed", {"status": "done"})
    assert bar.done_steps == 1000 + 1899  # the steps it did not reach, as any run that ends early
