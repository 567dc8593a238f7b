"""WatchCallback in a real Lightning fit: its per-head numbers reach the run's TensorBoard, CSV and W&B
loggers at the probe steps (read back from their files), and a stop alert ends the fit at its step."""

import csv
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("tensorboard")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from lightning_trainer import Shifted, language_model  # noqa: E402
from watch_readers import tensorboard_scalars, wandb_history  # noqa: E402

from attnscale.core.diagnostics import HEAD_MEASURES  # noqa: E402
from attnscale.errors import ConfigError  # noqa: E402
from attnscale.lm.data import load_corpus  # noqa: E402
from attnscale.lm.model import ModelConfig  # noqa: E402
from attnscale.watch.actions import ClipQK, ScaleLR, SkipStep  # noqa: E402
from attnscale.watch.alerts import MaxScore  # noqa: E402
from attnscale.watch.callbacks.lightning import WatchCallback  # noqa: E402
from attnscale.watch.logs.line import read_log  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    if "wandb" in sys.modules:  # its process-wide settings: this test's runs go under its own tmp_path
        sys.modules["wandb"].teardown()
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def _fit(tmp_path, callback, loggers, steps=4, accumulate=1, **model):
    import lightning.pytorch as pl
    import torch

    corpus = load_corpus("default")
    config = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=32, n_layers=2, n_heads=4,
                         head_dim=model.pop("head_dim", 8), **model)
    loader = torch.utils.data.DataLoader(Shifted(corpus.train, 16), batch_size=4)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[callback], logger=loggers,
                         accumulate_grad_batches=accumulate, log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(language_model(config, 1e-3), loader)
    return trainer


def test_every_logger_holds_the_per_head_numbers_at_the_probe_steps(tmp_path):
    pytest.importorskip("wandb")
    import wandb
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

    callback = WatchCallback(every=2, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")])
    loggers = [TensorBoardLogger(tmp_path, name="tb", version=""), CSVLogger(tmp_path, name="csv", version=""),
               WandbLogger(save_dir=str(tmp_path), project="attnscale-test", offline=True)]
    _fit(tmp_path, callback, loggers)
    wandb.finish()
    records = read_log(tmp_path / "w.jsonl")
    assert [r.step for r in records] == [0, 2, 4] and records[0].layers == 2 and records[0].heads == 4

    tb = tensorboard_scalars(tmp_path / "tb")
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        table = [row for row in csv.DictReader(f) if row.get("attn/max_score")]
    assert [int(row["step"]) for row in table] == [0, 2, 4]  # the baseline at step 0
    # Lightning logs the loss of the k-th batch at step k - 1: the loss at step 2 is the one made with the
    # weights the probe of step 2 measured (after 2 optimizer steps), in the same run
    assert set(tb["loss"]) == {0, 1, 2, 3}
    for m, measure in enumerate(HEAD_MEASURES):
        for layer in range(2):
            for head in range(4):
                key = f"attn/layer_{layer}/head_{head}/{measure}"
                want = {r.step: r.values[layer][m][head] for r in records}
                assert tb[key] == pytest.approx(want, rel=1e-6)
                assert {int(row["step"]): float(row[key]) for row in table} == pytest.approx(want, rel=1e-6)
    assert tb["attn/max_score"] == pytest.approx({r.step: r.summary["attn/max_score"] for r in records})

    rows = [r for r in wandb_history(tmp_path, rows=3) if "attn/layer_1/head_3/effective_words" in r]
    assert [r["trainer/global_step"] for r in rows] == [0, 2, 4]
    assert [r["attn/layer_1/head_3/effective_words"] for r in rows] == pytest.approx(
        [r.values[1][HEAD_MEASURES.index("effective_words")][3] for r in records], rel=1e-6)


def test_a_stop_alert_stops_the_fit_at_its_step(tmp_path):
    """Unscaled, head width 1024, q and k entries of variance 1 (``init="unit"``): scores of SD about
    sqrt(1024) = 32, so the largest of a probe passes 100 at the first probe."""
    callback = WatchCallback(every=2, alerts=[MaxScore(tau=100, action="stop")], sinks=[JsonlSink(tmp_path / "w.jsonl")])
    trainer = _fit(tmp_path, callback, False, steps=8, scale="none", init="unit", head_dim=1024)
    assert trainer.global_step == 2
    record = read_log(tmp_path / "w.jsonl")[-1]
    assert record.step == 2 and record.summary["attn/max_score"] > 100 and record.alerts


def test_steps_are_optimizer_steps_under_gradient_accumulation(tmp_path):
    callback = WatchCallback(every=2, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")], report=False)
    trainer = _fit(tmp_path, callback, False, steps=4, accumulate=2)
    assert trainer.global_step == 4 and [r.step for r in read_log(tmp_path / "w.jsonl")] == [0, 2, 4]


def _fit_fails(inner, training_step, callback, says: str):
    """A 2-step fit of a LightningModule around ``inner`` whose ``training_step(module, x)`` is given, with
    ``callback`` alone; the fit must raise a ConfigError that ``says``. Returns the Trainer."""
    import lightning.pytorch as pl
    import torch

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

        def training_step(self, batch, batch_idx):
            return training_step(self, batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(Shifted(torch.randint(0, 50, (200,)), 8), batch_size=2)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ConfigError, match=says):
        trainer.fit(Module(), loader)
    return trainer


def test_a_module_that_never_calls_its_forward_is_told_to_give_a_probe():
    model = language_model(ModelConfig(vocab_size=50, context=8, d_model=16, n_layers=1, n_heads=2), 1e-3).model
    # training_step calls the inner model, not self(x)
    _fit_fails(model, lambda module, x: module.inner(x).mean(), WatchCallback(every=1), "probe=")


def test_bad_options_fail_when_the_callback_is_made():
    with pytest.raises(ValueError, match="every"):
        WatchCallback(every=0)
    with pytest.raises(ConfigError, match="tensor_parallel takes an attnscale.watch.TensorParallel"):
        WatchCallback(tensor_parallel="tp")
    with pytest.raises(ConfigError, match=r"probe='records' is for attnscale's train\(\)"):
        WatchCallback(probe="records")


def test_a_model_with_no_attention_fails_before_the_first_step_of_the_fit():
    import torch

    trainer = _fit_fails(torch.nn.Embedding(50, 8), lambda module, x: module(x).pow(2).mean(),
                         WatchCallback(every=50), "no attention call of Module was seen")
    assert trainer.global_step == 0


def test_in_the_training_forward_every_accumulated_batch_counts_and_no_forward_is_added(tmp_path):
    callback = WatchCallback(every=2, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")], report=False,
                             in_training_forward=True, detail="layers")
    calls = []
    real_start = callback.start

    def start(model, step=0, **given):  # count the module's forwards from the moment the watch is made
        model.register_forward_pre_hook(lambda *_: calls.append(1))
        return real_start(model, step, **given)

    callback.start = start
    trainer = _fit(tmp_path, callback, False, steps=4, accumulate=2)
    records = read_log(tmp_path / "w.jsonl")
    assert trainer.global_step == 4 and [r.step for r in records] == [0, 2, 4]
    assert len(calls) == 4 * 2  # the training forwards alone: the baseline read step 1's
    assert [r.probe["forwards"] for r in records] == [2, 2, 2] and records[0].probe["sequences"] == 2 * 4
    assert len(records[0].values[0][0]) == 4  # the log keeps every head whatever the detail
    assert callback.latest[0] == 4 and "attn/layer_1/max_score" in callback.latest[1]


# Alerts that act (watch/actions.py) in a Lightning fit: AdamW (torch's weight decay 0.01) at a constant rate,
# 3 batches an epoch, unshuffled, the checkpoint saved after the epoch's last batch (step 3): Lightning resumes a
# plain DataLoader exactly only at an epoch's end
ANY = 1e-9  # a MaxScore level every head passes: the alert fires at every probe


def _acting(tmp_path, name, alerts, steps=4, resume=None, save=False):
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Kept(pl.Callback):
        """The weights after each optimizer step (after the watch's own step) and each step's loss."""

        def __init__(self):
            self.weights, self.losses = {}, {}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.weights[trainer.global_step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            self.losses[trainer.global_step] = outputs["loss"].detach().clone()

    corpus = load_corpus("default")
    config = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=32, n_layers=2, n_heads=4, head_dim=8,
                         init="unit")  # scores of SD about 1 at first
    data = torch.utils.data.Subset(Shifted(corpus.train, 16), range(12))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = WatchCallback(every=2, alerts=alerts, sinks=[JsonlSink(tmp_path / f"{name}.jsonl")], report=False)
    kept = Kept()
    saving = [ModelCheckpoint(dirpath=tmp_path / name, every_n_train_steps=3, save_top_k=-1)] if save else []
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[callback, kept, *saving],
                         logger=False, enable_checkpointing=save, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path / name))
    trainer.fit(language_model(config, 1e-2), loader, ckpt_path=resume)
    return callback, kept


def _equal(a, b):
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_action_acts_on_the_fit_from_the_step_after_its_probe(tmp_path):
    """At probe 2: ScaleLR(0.5, steps=1) halves update 3 (AdamW's decay and step both scale with the rate);
    SkipStep() leaves the weights of step 2 after step 3 (Lightning's closure still runs: step 3 has its loss);
    ClipQK clips every head from step 3 on (its capture takes the model's explicit attention path from then: the
    loss of step 3 agrees to float rounding)."""
    import torch

    alone = _acting(tmp_path, "alone", ())[1]
    scaled_cb, scaled = _acting(tmp_path, "scaled", [MaxScore(tau=ANY, action=ScaleLR(0.5, steps=1))])
    skip_cb, skipped = _acting(tmp_path, "skipped", [MaxScore(tau=ANY, action=SkipStep())])
    clip_cb, clipped = _acting(tmp_path, "clipped", [MaxScore(tau=ANY, action=ClipQK(0.5))])
    for run in (scaled, skipped, clipped):
        assert _equal(run.weights[1], alone.weights[1]) and _equal(run.weights[2], alone.weights[2])
        assert [float(run.losses[k]) for k in (1, 2)] == [float(alone.losses[k]) for k in (1, 2)]
    assert float(scaled.losses[3]) == float(skipped.losses[3]) == float(alone.losses[3])
    assert float(clipped.losses[3]) == pytest.approx(float(alone.losses[3]), rel=1e-6)
    before, after = alone.weights[2], alone.weights[3]
    for k, v in scaled.weights[3].items():
        torch.testing.assert_close(v - before[k], (after[k] - before[k]) / 2, rtol=0, atol=3e-7)
    assert _equal(skipped.weights[3], before) and not _equal(skipped.weights[4], before)
    assert not _equal(clipped.weights[3], after)
    assert [[(a["step"], a["action"]) for a in cb.actions] for cb in (scaled_cb, skip_cb, clip_cb)] == \
        [[(2, "scale_lr")], [(2, "skip_step")], [(2, "clip_qk")]]
    _, first, second = read_log(tmp_path / "clipped.jsonl")  # after the baseline
    assert first.actions == clip_cb.actions and not first.qk_clip and second.qk_clip["tau"] == 0.5
    assert all(c >= 1 for layer in second.qk_clip["clipped_steps"] for c in layer)  # each head clipped at step 3


@pytest.mark.parametrize("actions", [(ClipQK(0.5), ScaleLR(0.5, steps=2)), (SkipStep(2),)], ids=["clip-and-rate", "skip"])
def test_a_fit_resumed_from_its_checkpoint_after_an_action_goes_on_as_the_uninterrupted_one(tmp_path, actions):
    """The checkpoint after step 3, the first epoch's last batch (actions taken at probe 2, still in force), holds the
    watch's state; a fit resumed from it gives the uninterrupted fit's weights, losses, actions and watch log
    at steps 4 to 6, to the bit."""
    alerts = [MaxScore(tau=ANY, action=a) for a in actions]
    whole_cb, whole = _acting(tmp_path, "whole", alerts, steps=6, save=True)
    checkpoint = next((tmp_path / "whole").glob("epoch=0-step=3.ckpt"))
    resumed_cb, resumed = _acting(tmp_path, "resumed", alerts, steps=6, resume=str(checkpoint))
    assert sorted(resumed.weights) == [4, 5, 6]
    assert all(_equal(resumed.weights[k], whole.weights[k]) for k in (4, 5, 6))
    assert [float(resumed.losses[k]) for k in (4, 5, 6)] == [float(whole.losses[k]) for k in (4, 5, 6)]
    assert resumed_cb.actions == whole_cb.actions and len(whole_cb.actions) == len(actions)

    def lines(name):
        return [{k: v for k, v in r.to_json().items() if k not in ("time", "watch")}
                for r in read_log(tmp_path / name) if r.step > 3]

    assert lines("resumed.jsonl") == lines("whole.jsonl") and len(lines("whole.jsonl")) == 2
    alone = _acting(tmp_path, "alone", (), steps=6)[1]
    assert not _equal(alone.weights[6], whole.weights[6])  # the actions changed the run


def test_one_callback_is_refused_on_another_module_and_goes_on_with_a_second_fit_of_its_own(tmp_path):
    """Given to a fit of another module it would probe the first and log the second fit with its numbers; a
    second fit of the same module goes on, into the same log."""
    import lightning.pytorch as pl
    import torch

    callback = WatchCallback(every=1, alerts=(), report=False, sinks=[JsonlSink(tmp_path / "w.jsonl")])
    trainer = _fit(tmp_path / "a", callback, False, steps=1)
    module = trainer.lightning_module
    with pytest.raises(ConfigError, match=r"this WatchCallback already followed LanguageModel; a watch follows one "
                                          r"model: give each model its own WatchCallback\(\.\.\.\)"):
        _fit(tmp_path / "b", callback, False, steps=1)
    loader = torch.utils.data.DataLoader(Shifted(load_corpus("default").train, 16), batch_size=4)
    again = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                       enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                       default_root_dir=str(tmp_path / "c"))
    again.fit(module, loader)
    assert [line.step for line in read_log(tmp_path / "w.jsonl")] == [0, 1, 1, 2]  # one baseline: the first fit's


def test_clip_qk_on_a_qk_norm_module_is_refused_before_the_first_step(tmp_path):
    import lightning.pytorch as pl
    import torch

    corpus = load_corpus("default")
    config = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=16, n_layers=1, n_heads=2, scale="qk_norm")
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(Shifted(corpus.train, 16), range(8)), batch_size=4)
    callback = WatchCallback(every=3, alerts=[MaxScore(tau=1e-9, action=ClipQK(100))], report=False)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^MaxScore's action ClipQK\(tau=100\) cannot act on .*qk-norm"):
        trainer.fit(language_model(config, 1e-2), loader)
    assert trainer.global_step == 0


def test_a_rate_action_on_a_fit_of_two_optimizers_is_refused_before_the_first_step(tmp_path):
    """ScaleLR acts on one optimizer; a fit of two (manual optimization) would have had it act on none, in silence."""
    import lightning.pytorch as pl
    import torch

    module = language_model(ModelConfig(vocab_size=50, context=8, d_model=16, n_layers=1, n_heads=2), 1e-3)
    module.automatic_optimization = False
    module.configure_optimizers = lambda: [torch.optim.SGD(module.model.parameters(), lr=1e-3),
                                           torch.optim.SGD(module.model.parameters(), lr=1e-3)]
    loader = torch.utils.data.DataLoader([(torch.zeros(8, dtype=torch.long),) * 2] * 4, batch_size=2)
    callback = WatchCallback(every=2, alerts=[MaxScore(tau=1e-9, action=ScaleLR(0.5))], report=False)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^an alert's ScaleLR acts on the fit's optimizer, and this fit has 2; give "
                                          r"that alert another action, or fit with one optimizer$"):
        trainer.fit(module, loader)
    assert trainer.global_step == 0
