"""Experiment 4 (width sweep): its config, the presets it shares with dynamics, rows, the gap and where it starts."""

from dataclasses import replace

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import dynamics, sweep
from specs import TINY_MODEL, TINY_TRAIN


def row(head_dim, scale, seed, ppl, status="done", lr=None):
    return {"head_dim": head_dim, "scale": scale, "seed": seed, "lr": lr, "valid_ppl": ppl, "status": status}


# ---- the gap and where it starts ---------------------------------------------------


def test_gap_is_none_minus_scaled_mean_over_paired_seeds():
    rows = [row(32, "none", 0, 10.0), row(32, "inv_sqrt_d", 0, 10.5),
            row(32, "none", 1, 12.0), row(32, "inv_sqrt_d", 1, 11.5)]
    [g] = sweep.gap_table(rows)["rows"]
    assert g["gap"] == pytest.approx(0.0) and g["seeds"] == 2
    assert g["gap_se"] == pytest.approx(0.5)  # per-seed gaps -0.5 and +0.5: sd 0.707, / sqrt 2
    assert g["baseline_ppl"] == pytest.approx(11.0) and g["reference_ppl"] == pytest.approx(11.0)


def test_gap_starts_where_it_holds_at_every_wider_head_dim():
    ppl_none = {32: 100.0, 64: 102.5, 128: 100.5, 256: 103.0, 512: 120.0}  # 64 is a blip, 128 is below 1 ppl
    rows = [r for w, p in ppl_none.items() for r in (row(w, "none", 0, p), row(w, "inv_sqrt_d", 0, 100.0))]
    table = sweep.gap_table(rows)
    assert [g["counts"] for g in table["rows"]] == [False, True, False, True, True]
    assert table["gap_starts_at"] == 256
    assert "starts at width 256" in sweep.format_table(rows)


def test_gap_within_seed_noise_does_not_count():
    rows = [row(64, "none", 0, 105.0), row(64, "inv_sqrt_d", 0, 100.0),
            row(64, "none", 1, 95.0), row(64, "inv_sqrt_d", 1, 98.0)]  # gaps +5 and -3: mean 1, SE 4
    table = sweep.gap_table(rows)
    assert not table["rows"][0]["counts"] and table["gap_starts_at"] is None
    assert "no width shows a gap" in sweep.format_table(rows)


def test_an_undecided_gap_gives_the_start_both_ways_in_the_table():
    # d=64: gaps 2 and 4 (2 seeds): 3 ± 1, its 95% interval 3 ± 12.7 reaches 0: undecided; d=128: 17 and 18,
    # 17.5 ± 0.5, interval 11.1 … 23.9: a gap. The gap starts at 128, or at 64 if d=64's gap is real
    rows = [row(64, "none", 0, 102.0), row(64, "inv_sqrt_d", 0, 100.0), row(64, "none", 1, 104.0),
            row(64, "inv_sqrt_d", 1, 100.0), row(128, "none", 0, 117.0), row(128, "inv_sqrt_d", 0, 100.0),
            row(128, "none", 1, 118.0), row(128, "inv_sqrt_d", 1, 100.0)]
    text = sweep.format_table(rows)
    assert "it starts at width 128 (at width 64 if the gaps not yet beyond their noise are real)" in text
    assert "+3.00 ±1.00" in text and "+17.50 ±0.50" in text


def test_diverged_baseline_counts_as_a_gap_and_other_schemes_are_listed():
    rows = [row(1024, "none", 0, None, "diverged"), row(1024, "inv_sqrt_d", 0, 50.0), row(1024, "qk_norm", 0, 49.0)]
    table = sweep.gap_table(rows)
    assert table["rows"][0]["diverged"] == "baseline" and table["gap_starts_at"] == 1024
    text = sweep.format_table(rows)
    assert "qk-norm" in text and "49.00" in text and "diverged" in text


def test_gap_per_learning_rate():
    rows = [row(32, s, 0, p, lr=lr) for lr, (a, b) in ((1e-3, (10.0, 10.0)), (1e-2, (20.0, 10.0)))
            for s, p in (("none", a), ("inv_sqrt_d", b))]
    table = sweep.gap_table(rows)
    assert table["starts"] == [{"lr": 1e-3, "head_dim": None, "head_dim_if_undecided": None},
                               {"lr": 1e-2, "head_dim": 32, "head_dim_if_undecided": 32}]
    assert table["gap_starts_at"] is None  # one answer per lr
    assert "lr 0.01" in sweep.format_table(rows)


# ---- configs and presets ------------------------------------------------------------


@pytest.mark.parametrize("bad, words", [
    (dict(head_dims=()), r"head_dims must be a non-empty list without repeats, got \(\)"),
    (dict(head_dims=(0,)), r"head_dims must be positive integers, got \(0,\)"),
    (dict(head_dims=(8, 8)), r"head_dims must be a non-empty list without repeats, got \(8, 8\)"),
    (dict(scales=("loud",)), "model scale 'loud' is unknown"),
    (dict(seeds=(-1,)), r"seeds must be non-negative integers, got \(-1,\)"),
    (dict(lrs=(0.0,)), "train lr must be a positive number, got 0.0"),
    (dict(model={"colour": 1}), r"model settings \['colour'\]")])
def test_sweep_config_rejects_bad_values(bad, words):
    with pytest.raises(ConfigError, match=words):
        sweep.SweepConfig(**bad)


@pytest.mark.parametrize("quick", [True, False])
def test_presets_make_the_dynamics_pair_the_sweeps_widest_pair(quick):
    dyn = dynamics.preset(quick=quick, seed=3)
    swp = sweep.preset(quick=quick, seed=3)
    assert dyn.head_dim == max(swp.head_dims) == 1024 and swp.head_dims[0] == 32
    assert set(dyn.scales) <= set(swp.scales) and swp.seeds == (3,)
    widest = {s.run_id: s for s in sweep.specs(swp, 104) if s.model.head_dim == 1024}
    for s in dynamics.specs(dyn, 104):
        assert (widest[s.run_id].model, widest[s.run_id].train) == (s.model, s.train)


def test_experiment_presets_take_the_budget_and_load_no_corpus_when_given_its_vocabulary(monkeypatch):
    from attnscale.lm.presets import budget
    from attnscale.runs.runner import CorpusSpec

    def no_load(self):
        raise AssertionError("the corpus was loaded although its vocabulary was given")

    monkeypatch.setattr(CorpusSpec, "load", no_load)
    d, s = dynamics.preset(vocab_size=33278), sweep.preset(vocab_size=33278)
    assert d.train == s.train == budget("default", 33278).train and d.model == s.model == budget().model
    assert dynamics.preset(quick=True, vocab_size=104).train == budget("quick").train


# ---- tiny real runs -----------------------------------------------------------------


def test_sweep_runs_any_registered_scheme(tmp_path):
    scales = ("none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp")
    cfg = sweep.SweepConfig(head_dims=(8,), scales=scales, model=TINY_MODEL, train=TINY_TRAIN)
    rows = sweep.run(cfg, tmp_path, progress=False)
    assert [r["scale"] for r in rows] == list(scales)
    assert all(r["status"] == "done" and r["valid_ppl"] > 1 for r in rows)
    assert sweep.gap_table(rows)["rows"][0]["head_dim"] == 8


def test_sweep_with_learning_rates_names_runs_by_lr(tmp_path):
    cfg = sweep.SweepConfig(head_dims=(8,), scales=("none",), lrs=(1e-3, 3e-3), model=TINY_MODEL,
                            train=replace(TINY_TRAIN, steps=3))
    rows = sweep.run(cfg, tmp_path, progress=False)
    assert [(r["run_id"], r["lr"]) for r in rows] == [("d8-none-s0-lr1e-3", 1e-3), ("d8-none-s0-lr3e-3", 3e-3)]
