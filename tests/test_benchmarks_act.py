"""benchmarks/act_step_cost.py at smoke size: every arm runs (C's and D's actions on), and its ratio interval is
the t interval of the rounds' ratios, checked by hand."""

import re

import pytest
import torch

from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("act_step_cost.py")


def test_the_ratio_is_the_mean_of_the_rounds_with_a_t_interval(bench):
    s = bench.ratio_summary([1.2, 1.3, 1.4])
    half = 4.302652729749464 * 0.1 / 3 ** 0.5  # t(0.975, 2) from the tables, SD 0.1 over 3 rounds
    assert s["mean"] == pytest.approx(1.3) and s["interval"] == pytest.approx((1.3 - half, 1.3 + half))
    assert bench.ratio_summary([1.1])["interval"] is None


def test_smoke_run_prints_every_arm(bench, capsys):
    assert bench.main(["--rounds", "2", "--steps", "12", "--width", "16", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^A: median [\d.]+ ms a step \(the baseline\)$", out, re.M)
    for arm in "BCDE":
        assert re.search(rf"^{arm}: median [\d.]+ ms a step, ratio to A [\d.]+ \[-?[\d.]+, [\d.]+\]$", out, re.M)
    with pytest.raises(SystemExit):
        bench.main(["--arms", "B", "C"])


def test_flush_denormal_flushes_while_it_measures_and_puts_the_arithmetic_back(bench, capsys, monkeypatch):
    """A subnormal float reads 0 inside the measurement with --flush-denormal, and is a subnormal again after."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)  # under float32's smallest normal, 1.18e-38
    seen = []
    real = bench.one_arm

    def spying(arm, args, corpus):
        seen.append((tiny * 1.0).item())
        return real(arm, args, corpus)

    monkeypatch.setattr(bench, "one_arm", spying)
    assert bench.main(["--rounds", "1", "--steps", "12", "--width", "16", "--batch", "2", "--arms", "A", "D",
                       "--flush-denormal"]) == 0
    assert "subnormal floats flushed to zero" in capsys.readouterr().out
    assert seen and set(seen) == {0.0}
    assert (tiny * 1.0).item() == pytest.approx(1e-40, rel=1e-3)


def test_muon_runs_train_under_muon(bench, capsys, monkeypatch):
    """--optimizer muon trains every arm as the lr study's Muon runs: the config each arm trains names it."""
    import attnscale.lm.train as lm_train

    seen = []
    real = lm_train.train

    def spying(model, cfg, corpus, **kw):
        seen.append(cfg.optimizer)
        return real(model, cfg, corpus, **kw)

    monkeypatch.setattr(bench, "train", spying)
    assert bench.main(["--rounds", "1", "--steps", "12", "--width", "16", "--batch", "2", "--arms", "A", "C",
                       "--optimizer", "muon"]) == 0
    assert "muon; CPU time a step" in capsys.readouterr().out and seen and set(seen) == {"muon"}
    with pytest.raises(SystemExit):
        bench.main(["--optimizer", "sgd"])
