"""Requests that can never fit are refused before anything is allocated or written:
one line on stderr with the estimate and the limit, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from attnscale import limits
from attnscale.errors import ConfigError


def run_cli(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "attnscale.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _refused(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscale: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, needles", [
    # tensors larger than any machine's memory
    (["spread", "--pairs", str(10**10)], ("10,000,000,000 pairs", "of memory", "this machine has")),
    (["fresh", "--words", str(10**6), "--widths", "65536"], ("1,000,000 words", "of memory")),
])
def test_init_experiments_refuse_what_cannot_fit(tmp_path, args, needles):
    out = tmp_path / "out"
    _refused(run_cli(*args, "--out", str(out)), *needles)
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("args, needles", [
    (["train", "--width", str(10**6)], ("head width 1,000,000", "of memory")),
    (["train", "--steps", str(10**9)], ("1,000,000,000 steps", "would take at least", "days", "ATTNSCALE_MAX_HOURS")),
])
def test_training_refuses_what_cannot_fit_or_finish(tmp_path, args, needles):
    out = tmp_path / "out"
    _refused(run_cli(*args, "--quick", "--out", str(out)), *needles)
    assert not out.exists()


def test_the_time_limit_is_the_users_to_set(tmp_path):
    out = tmp_path / "out"
    line = _refused(run_cli("spread", "--out", str(out), env={"ATTNSCALE_MAX_HOURS": "1e-9"}),
                    "would take at least", "the limit is 1e-09 hours")
    assert "20,000 pairs" in line and not out.exists()
    _refused(run_cli("spread", env={"ATTNSCALE_MAX_HOURS": "soon"}), "ATTNSCALE_MAX_HOURS must be a positive number")


def test_python_callers_get_the_same_refusal():
    from attnscale.experiments import fresh, spread, sweep
    from attnscale.experiments.training_config import default_train

    with pytest.raises(ConfigError, match="of memory"):
        spread.SpreadConfig(pairs=10**10)
    with pytest.raises(ConfigError, match="of memory"):
        fresh.FreshConfig(words=10**6, head_dims=(65536,))
    with pytest.raises(ConfigError, match="would take at least"):
        sweep.SweepConfig(train=default_train().__class__(steps=10**9))
    with pytest.raises(ConfigError, match="d=100,000,000,000 needs at least"):
        spread.SpreadConfig(head_dims=(10**11,), pairs=2)  # one pair's q and k alone
    base = sweep.SweepConfig()
    with pytest.raises(ConfigError, match="batch 100,000,000"):
        replace(base, train=replace(base.train, batch=10**8))
    with pytest.raises(ConfigError, match="context 10,000,000"):
        replace(base, model={**base.model, "context": 10**7})
    spread.SpreadConfig()  # the defaults fit, of course
    fresh.FreshConfig()
    sweep.SweepConfig()


def test_estimates_are_on_the_low_side_of_what_runs_here():
    # the full reproduce's largest run (d=1,024, batch 16, context 64, 400 steps, a char vocabulary):
    # far below the limits, whatever the machine
    est = limits.training_cost(vocab=100, context=64, d_model=64, n_layers=2, n_heads=4, head_dim=1024,
                               mlp_ratio=4, batch=16, steps=400)
    assert est.bytes < 200e6 and est.seconds < 60
    # q and k of a fresh head: 200 × 64 × 1,024 floats each, 52 MB together
    assert limits.fresh_cost((1024,), 64, 200, 2).bytes >= 2 * 200 * 64 * 1024 * 4


def test_a_folder_of_unreadable_records_is_an_error_not_an_empty_report(tmp_path):
    for name, text in (("a", "{not json"), ("b", json.dumps([1, 2]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(text)
    line = _refused(run_cli("report", str(tmp_path)), "none of the records", "2 skipped")
    assert "first: a: skipped (record.json is not valid JSON" in line
    assert not (tmp_path / "report").exists()
