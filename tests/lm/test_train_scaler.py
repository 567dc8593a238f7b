"""lm.train's fp16 and host-decided paths, taken on the CPU.

fp16 is refused on CPUs (no fast fp16 matmuls), but what a GPU's fp16 run adds to a step is torch's
GradScaler, which runs on the CPU too: these tests hand a run a CPU GradScaler in place of the no-op one
and train in fp32, so every branch a scaled run takes (the scaled backward, unscaling before the clip, a
step skipped and retried on the next batch, the scale halved, the skips counted, the scale and the count
carried through a checkpoint, the run given up after 40 skips in a row) is taken here. A GradScaler scales
by a power of two, which moves no digit of an fp32 gradient, so a scaled run is the plain run to the bit.

The update decided on the host (MPS, whose fused AdamW ignored a skip until mid-2026) is taken the same way:
the run's fused AdamW replaced by torch's foreach one."""

import math

import pytest
import torch

from attnscale.core import device as dev
from attnscale.lm import train as T
from attnscale.lm.model import ModelConfig
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)

CFG = dict(steps=6, batch=4, record_every=3, eval_batches=2, threads=1)


def mcfg() -> ModelConfig:
    return ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4)


@pytest.fixture
def scalers(monkeypatch):
    """Every run builds a CPU GradScaler at ``scalers.init`` (2**10 unless set), never growing its scale;
    ``scalers.made`` holds them in the order the runs made them."""

    class Scalers:
        init = 2.0 ** 10
        made: list = []

        def __call__(self, precision):
            s = torch.amp.GradScaler("cpu", init_scale=self.init, growth_interval=10 ** 9)
            self.made.append(s)
            return s

    got = Scalers()
    got.made = []
    monkeypatch.setattr(dev, "grad_scaler", got)
    return got


def non_finite_objective_at(monkeypatch, calls: set[int] | None):
    """From here on, the step's objective is multiplied by inf at the forward calls numbered in ``calls``
    (from 0; None: every call): its gradients overflow as an fp16 step's do, its loss stays finite.
    Returns the list the calls are counted in."""
    step_losses, counted = T.step_losses, []

    def overflowing(*args, **kwargs):
        loss, objective, log_z = step_losses(*args, **kwargs)
        n = len(counted)
        counted.append(n)
        return loss, (objective * math.inf if calls is None or n in calls else objective), log_z

    monkeypatch.setattr(T, "step_losses", overflowing)
    return counted


def test_a_scaled_run_is_the_plain_run_to_the_bit(corpus, scalers, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(dev, "grad_scaler", lambda precision: torch.amp.GradScaler("cpu", enabled=False))
        plain = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    scaled = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    assert scaled["losses"] == plain["losses"] and scaled["valid_loss"] == plain["valid_loss"]
    assert [x.get("grad_norm") for x in scaled["history"]] == [x.get("grad_norm") for x in plain["history"]]
    assert [x["step"] for x in scaled["history"]] == [0, 3, 6] and scaled["notes"] == []  # 6: the trained model
    assert scalers.made[0].get_scale() == 2.0 ** 10  # nothing overflowed: the scale never halved


def test_an_overflowing_step_is_skipped_retried_on_the_next_batch_and_counted(corpus, scalers, monkeypatch):
    counted = non_finite_objective_at(monkeypatch, {0, 1, 4})  # step 0 twice, then step 2's first try
    steps_told = []
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus, on_step=lambda *a: steps_told.append(a[0]))
    assert got["status"] == "done" and got["steps_done"] == 6 and len(got["losses"]) == 6
    assert len(counted) == 6 + 3  # six steps and three retries
    assert scalers.made[0].get_scale() == 2.0 ** 10 / 2 ** 3  # halved at each skip
    assert steps_told == [1, 2, 3, 4, 5, 6]  # a skipped step is not a step
    assert "the fp16 gradient scaler skipped 3 step(s) with inf/NaN gradients; they are not counted and did not " \
           "move the schedule" in got["notes"]
    # the recording step 0 is logged once, from the try that was kept, at the schedule's step 0
    assert [x["step"] for x in got["history"]] == [0, 3, 6]
    assert got["history"][0]["lr"] == T.lr_at(0, T.TrainConfig(**CFG)) and got["history"][0]["loss"] == got["losses"][0]


def test_a_skipped_step_draws_a_new_batch_and_leaves_the_weights_as_they_were(corpus, scalers, monkeypatch):
    """Step 0 overflows once: what follows is the plain run from the same weights, one batch further on."""
    cfg = T.TrainConfig(**{**CFG, "record_every": 1})
    with monkeypatch.context() as m:
        non_finite_objective_at(m, {0})
        skipped = T.train(mcfg(), cfg, corpus)
    run = T.build_run(mcfg(), cfg, None)
    run.batch(corpus)  # the batch the skipped try drew
    by_hand = [T.train_step(run, step, corpus)[0] for step in range(cfg.steps)]
    assert skipped["losses"] == pytest.approx(by_hand, rel=1e-5)
    unskipped = T.train(mcfg(), cfg, corpus)
    assert abs(unskipped["losses"][0] - skipped["losses"][0]) > 1e-3  # another batch: another loss


def test_forty_skips_in_a_row_end_the_run_as_diverged_at_the_step_they_retried(corpus, scalers, monkeypatch):
    calls = non_finite_objective_at(monkeypatch, None)  # from the first step on: the scale never helps
    tries = iter(range(1000))
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus, should_stop=lambda: next(tries) > 100)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 0, 0)
    assert len(calls) == 41  # forty skips are retried; the 41st in a row gives up
    assert "the fp16 gradient scaler skipped 40 step(s) with inf/NaN gradients; they are not counted and did not " \
           "move the schedule" in got["notes"]


def test_forty_skips_in_a_row_count_from_the_last_step_kept(corpus, scalers, monkeypatch):
    calls = non_finite_objective_at(monkeypatch, set(range(2, 1000)))  # two steps kept, then none
    tries = iter(range(1000))
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus, should_stop=lambda: next(tries) > 100)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 2, 2)
    assert len(calls) == 2 + 41


def test_skips_apart_never_add_up_to_giving_up(corpus, scalers, monkeypatch):
    scalers.init = 2.0 ** 60  # room to halve 45 times
    cfg = T.TrainConfig(**{**CFG, "steps": 50, "record_every": 25})
    calls = non_finite_objective_at(monkeypatch, set(range(1, 90, 2)))  # every other try, 45 times
    got = T.train(mcfg(), cfg, corpus)
    assert (got["status"], got["steps_done"]) == ("done", 50) and len(calls) == 50 + 45
    assert "the fp16 gradient scaler skipped 45 step(s)" in got["notes"][0]


def test_a_resumed_run_keeps_its_loss_scale_and_its_skips(corpus, scalers, monkeypatch, tmp_path):
    cfg = T.TrainConfig(**{**CFG, "checkpoint_every": 2})
    non_finite_objective_at(monkeypatch, {1, 2})  # step 1 twice: the scale halved twice, two skips
    whole = T.train(mcfg(), cfg, corpus)
    path, tries = tmp_path / "c.pt", iter(range(100))
    non_finite_objective_at(monkeypatch, {1, 2})
    T.train(mcfg(), cfg, corpus, checkpoint=path, should_stop=lambda: next(tries) >= 5)  # stops after step 3
    state = torch.load(path, weights_only=False)
    assert state["step"] == 2 and state["skipped"] == 2 and state["scaler"]["scale"] == 2.0 ** 8
    non_finite_objective_at(monkeypatch, {1})  # one more skip after the resume, at step 3's first try
    resumed = T.train(mcfg(), cfg, corpus, checkpoint=path)
    assert resumed["resumed_from"] == 2 and scalers.made[-1].get_scale() == 2.0 ** 7
    assert "the fp16 gradient scaler skipped 3 step(s)" in resumed["notes"][0]
    assert scalers.made[0].get_scale() == 2.0 ** 8 and "skipped 2 step(s)" in whole["notes"][0]


def test_a_checkpoint_from_before_skips_were_kept_counts_those_after_it(corpus, scalers, monkeypatch, tmp_path):
    cfg = T.TrainConfig(**{**CFG, "checkpoint_every": 2})
    path, tries = tmp_path / "c.pt", iter(range(100))
    T.train(mcfg(), cfg, corpus, checkpoint=path, should_stop=lambda: next(tries) >= 3)
    state = torch.load(path, weights_only=False)
    state.pop("skipped")
    torch.save(state, path)
    non_finite_objective_at(monkeypatch, {0, 2})
    resumed = T.train(mcfg(), cfg, corpus, checkpoint=path)
    assert resumed["resumed_from"] == 2 and "skipped 2 step(s)" in resumed["notes"][0]


@pytest.fixture
def host_decides(monkeypatch):
    """Every run's AdamW is torch's foreach one, same groups and settings: the host decides each skip."""
    build = T.build_run

    def foreach(*args, **kwargs):
        run = build(*args, **kwargs)
        groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in run.opt.param_groups]
        run.opt = torch.optim.AdamW(groups, foreach=True)
        assert not run.opt.defaults.get("fused")
        return run

    monkeypatch.setattr(T, "build_run", foreach)


def test_the_host_decided_update_is_the_fused_one(corpus, host_decides, monkeypatch):
    host = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    monkeypatch.undo()
    fused = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    assert host["status"] == "done" and host["losses"] == pytest.approx(fused["losses"], rel=1e-5)
    assert host["losses"][1:] != [host["losses"][0]] * 5  # the weights moved


def test_the_host_decided_update_skips_a_step_whose_gradients_are_not_finite(corpus, host_decides, monkeypatch):
    after, step = [], T.train_step

    def stepped(run, s, corpus):
        got = step(run, s, corpus)
        after.append([p.detach().clone() for p in run.model.parameters()])
        return got

    monkeypatch.setattr(T, "train_step", stepped)
    non_finite_objective_at(monkeypatch, {2})
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 2, 2) and len(after) == 3
    assert not all(torch.equal(a, b) for a, b in zip(after[1], after[0]))  # step 1 moved the weights
    assert all(torch.equal(a, b) for a, b in zip(after[2], after[1]))  # step 2 left them as they were


def test_the_host_decided_update_with_a_scaler_skips_and_retries(corpus, host_decides, scalers, monkeypatch):
    counted = non_finite_objective_at(monkeypatch, {0})
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    assert got["status"] == "done" and len(counted) == 6 + 1 and "skipped 1 step(s)" in got["notes"][0]
    assert scalers.made[0].get_scale() == 2.0 ** 9


@pytest.mark.parametrize("path", ["fused", "host"])
def test_a_step_whose_loss_is_not_finite_leaves_the_weights_as_they_were_under_a_scaler(corpus, scalers, monkeypatch,
                                                                                         path, request):
    """The loss inf, its gradients finite (the scaler finds nothing to skip for): the step still moves nothing."""
    if path == "host":
        request.getfixturevalue("host_decides")
    after, step, step_losses = [], T.train_step, T.step_losses
    calls = []

    def stepped(run, s, corpus):
        got = step(run, s, corpus)
        after.append([p.detach().clone() for p in run.model.parameters()])
        return got

    def inf_loss(*args, **kwargs):
        loss, objective, log_z = step_losses(*args, **kwargs)
        calls.append(1)
        return (loss * math.inf if len(calls) == 3 else loss), objective, log_z

    monkeypatch.setattr(T, "train_step", stepped)
    monkeypatch.setattr(T, "step_losses", inf_loss)
    got = T.train(mcfg(), T.TrainConfig(**CFG), corpus)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 2, 2) and len(after) == 3
    assert all(torch.equal(a, b) for a, b in zip(after[2], after[1]))
