"""WatchCallback in a real Hugging Face Trainer: its numbers reach the run's own TensorBoard and W&B
integrations beside the loss at the same steps, and a stop alert stops the Trainer at its step."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from tiny_llama import corpus_windows, tiny_llama  # noqa: E402
from watch_readers import tensorboard_scalars, wandb_history  # noqa: E402

from transformers import TrainerCallback  # noqa: E402

from attnscale.core.diagnostics import HEAD_MEASURES  # noqa: E402
from attnscale.errors import ConfigError  # noqa: E402
from attnscale.watch.actions import ClipQK, ScaleLR, SkipStep  # noqa: E402
from attnscale.watch.alerts import MaxScore  # noqa: E402
from attnscale.watch.callbacks.hf import WatchCallback  # noqa: E402
from attnscale.watch.logs.line import read_log  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
                        "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "attnscale-test",
                        "TENSORBOARD_LOGGING_DIR": ""}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR")
    # wandb keeps its settings (WANDB_DIR among them) in a process-wide singleton made by the first
    # run of the process: reset it, so this test's runs go under its own tmp_path whatever ran before
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def _trainer(tmp_path, callback, report_to, steps=4, unscaled=False, init_std=0.02, head_dim=None, accumulate=1,
             **options):
    from transformers import Trainer, TrainingArguments

    data, vocab = corpus_windows(16)
    model = tiny_llama(vocab, layers=2, hidden=32, heads=4, kv_heads=2, head_dim=head_dim,
                       context=16, unscaled=unscaled, init_std=init_std)
    options = {"learning_rate": 1e-3, "logging_steps": 1000, "save_strategy": "no", **options}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
                             report_to=report_to,
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
                             gradient_accumulation_steps=accumulate, **options)
    return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def test_the_numbers_reach_tensorboard_and_wandb_beside_the_loss(tmp_path):
    pytest.importorskip("wandb")  # the extra attnscale[watch]
    callback = WatchCallback(every=2, sinks=[JsonlSink(tmp_path / "w.jsonl")], alerts=())
    import wandb

    _trainer(tmp_path, callback, ["tensorboard", "wandb"]).train()
    wandb.finish()  # the Trainer leaves the run open; finishing it writes the last rows out
    records = read_log(tmp_path / "w.jsonl")
    assert [r.step for r in records] == [0, 2, 4]  # the baseline, relayed with the first log after it
    assert records[0].layers == 2 and records[0].heads == 4  # 4 query heads over 2 kv heads

    tb = tensorboard_scalars(tmp_path / "out" / "runs")
    assert set(tb["train/loss"]) == {2, 4}  # the Trainer logged its loss at the probe steps
    for m, measure in enumerate(HEAD_MEASURES):
        for layer in range(2):
            for head in range(4):
                want = {r.step: r.values[layer][m][head] for r in records}
                assert tb[f"train/attn/layer_{layer}/head_{head}/{measure}"] == pytest.approx(want, rel=1e-6)
    assert tb["train/attn/max_score"] == pytest.approx({r.step: r.summary["attn/max_score"] for r in records})
    assert len(list((tmp_path / "out" / "runs").iterdir())) == 1  # one run folder, as the Trainer's

    rows = wandb_history(tmp_path, rows=5)  # the Trainer's two loss rows and the watch's three
    watched = [r for r in rows if "train/attn/layer_1/head_3/effective_words" in r]
    assert [r["train/global_step"] for r in watched] == [0, 2, 4]
    losses = [r["train/global_step"] for r in rows if "train/loss" in r]
    assert losses == [2, 4]
    assert [r["train/attn/layer_1/head_3/effective_words"] for r in watched] == pytest.approx(
        [r.values[1][HEAD_MEASURES.index("effective_words")][3] for r in records], rel=1e-6)


def test_report_false_keeps_the_integrations_out(tmp_path):
    callback = WatchCallback(every=2, alerts=(), report=False)
    _trainer(tmp_path, callback, ["tensorboard"]).train()
    tb = tensorboard_scalars(tmp_path / "out" / "runs")
    assert "train/loss" in tb and not any(k.startswith("train/attn/") for k in tb)
    assert callback.latest[0] == 4 and "attn/max_score" in callback.latest[1]


def test_a_stop_alert_stops_the_trainer_at_its_step(tmp_path):
    """Llama with its 1/sqrt(head_dim) set to 1 at head width 64, weights of SD 0.5 (q and k entries of
    SD about 0.5·sqrt(32) = 2.8, scores of SD about 8·2.8² = 64): max |score| passes 100 at step 2."""
    callback = WatchCallback(every=2, alerts=[MaxScore(tau=100, action="stop")],
                             sinks=[JsonlSink(tmp_path / "w.jsonl")])
    trainer = _trainer(tmp_path, callback, "none", steps=8, unscaled=True, init_std=0.5, head_dim=64)
    trainer.train()
    assert trainer.state.global_step == 2
    record = read_log(tmp_path / "w.jsonl")[-1]
    assert record.step == 2 and record.summary["attn/max_score"] > 100 and record.alerts


def test_the_scaled_twin_runs_to_the_end(tmp_path):
    callback = WatchCallback(every=2, alerts=[MaxScore(tau=100, action="stop")])
    trainer = _trainer(tmp_path, callback, "none", steps=4, init_std=0.5, head_dim=64)
    trainer.train()
    assert trainer.state.global_step == 4 and callback.latest[1]["attn/max_score"] < 100


def test_bad_options_fail_when_the_callback_is_made():
    with pytest.raises(ValueError, match="every"):
        WatchCallback(every=0)
    with pytest.raises(ConfigError, match=r"wrap it: sinks=\[JsonlSink\('watch.jsonl'\)\]"):
        WatchCallback(sinks="watch.jsonl")
    with pytest.raises(ConfigError, match=r"MaxScore\(tau=100\)"):
        WatchCallback(alerts=["max_score"])
    with pytest.raises(ConfigError, match=r"probe='records' is for attnscale's train\(\)"):
        WatchCallback(probe="records")


def test_a_probe_the_model_cannot_take_fails_when_training_begins_not_at_step_every(tmp_path):
    import torch

    steps = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    ids = torch.randint(0, 50, (2, 16))
    with pytest.raises(ConfigError, match="the probe's input_ids holds torch.float32 values"):
        WatchCallback(every=50, probe={"input_ids": ids.float()})  # float ids: refused when made
    callback = WatchCallback(every=50, probe={"inputs": ids})  # no such argument: found by trying it on the model
    trainer = _trainer(tmp_path, callback, "none", steps=2)
    trainer.add_callback(Steps())
    with pytest.raises(ConfigError, match="probe batch does not run on LlamaForCausalLM"):
        trainer.train()
    assert steps == [] and trainer.state.global_step == 0


def test_in_the_training_forward_per_layer_numbers_reach_tensorboard(tmp_path):
    from attnscale.watch.logs.detail import layer_table

    callback = WatchCallback(every=2, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")], in_training_forward=True,
                             detail="layers")
    _trainer(tmp_path, callback, ["tensorboard"], accumulate=2).train()
    records = read_log(tmp_path / "w.jsonl")
    assert [r.step for r in records] == [0, 2, 4] and [r.probe["forwards"] for r in records] == [2, 2, 2]
    tb = tensorboard_scalars(tmp_path / "out" / "runs")
    assert not any("/head_" in tag for tag in tb)
    for m, measure in enumerate(HEAD_MEASURES):
        for layer in range(2):
            want = {r.step: layer_table(r)[layer][m] for r in records}
            assert tb[f"train/attn/layer_{layer}/{measure}"] == pytest.approx(want, rel=1e-6)


# Alerts that act (watch/actions.py) under the Trainer: plain SGD at a constant rate, every step's loss logged,
# weights of SD 0.5 (scores in the tens: a ClipQK at tau 1 clips every head)
ANY = 1e-9  # a MaxScore level every head passes: the alert fires at every probe
ACTING = {"optim": "sgd", "lr_scheduler_type": "constant", "learning_rate": 1e-2, "logging_steps": 1}


class Kept(TrainerCallback):
    """The weights after each optimizer step (after the watch's own step, QK-Clip included)."""

    def __init__(self):
        self.weights = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def _acting(tmp_path, name, alerts, steps=4, resume=None, **options):
    kept = Kept()
    callback = WatchCallback(every=2, alerts=alerts, sinks=[JsonlSink(tmp_path / f"{name}.jsonl")], report=False)
    trainer = _trainer(tmp_path / name, callback, "none", steps=steps, init_std=0.5, **ACTING, **options)
    trainer.add_callback(kept)
    trainer.train(resume_from_checkpoint=resume)
    losses = {row["step"]: row["loss"] for row in trainer.state.log_history if "loss" in row}
    return callback, kept.weights, losses


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _lines(path, steps):
    return [{k: v for k, v in r.to_json().items() if k not in ("time", "watch")} for r in read_log(path)
            if r.step in steps]


def test_each_action_acts_on_the_trainer_from_the_step_after_its_probe(tmp_path):
    """At probe 2: ScaleLR(0.5, steps=1) halves update 3; SkipStep() leaves the weights of step 2 after step 3;
    ClipQK(1) clips from step 3 on (the log of probe 2 has no clip, that of probe 4 every head clipped)."""
    _, alone, _ = _acting(tmp_path, "alone", ())
    scaled_cb, scaled, _ = _acting(tmp_path, "scaled", [MaxScore(tau=ANY, action=ScaleLR(0.5, steps=1))])
    skip_cb, skipped, _ = _acting(tmp_path, "skipped", [MaxScore(tau=ANY, action=SkipStep())])
    clip_cb, clipped, _ = _acting(tmp_path, "clipped", [MaxScore(tau=ANY, action=ClipQK(1.0))])
    for run in (scaled, skipped, clipped):
        assert _equal(run[1], alone[1]) and _equal(run[2], alone[2])
    for k, v in scaled[3].items():
        # to the rounding of weights of size about 1 (float32 spacing 1.2e-7 there)
        torch.testing.assert_close(v - alone[2][k], (alone[3][k] - alone[2][k]) / 2, rtol=0, atol=3e-7)
    assert _equal(skipped[3], alone[2]) and not _equal(skipped[4], skipped[3])
    assert not _equal(clipped[3], alone[3])
    assert [[a["action"] for a in cb.actions] for cb in (scaled_cb, skip_cb, clip_cb)] == \
        [["scale_lr"], ["skip_step"], ["clip_qk"]]
    assert all(cb.actions[0]["step"] == 2 and cb.actions[0]["layer"] == cb.actions[0]["head"] == 0
               for cb in (scaled_cb, skip_cb, clip_cb))
    baseline, first, second = read_log(tmp_path / "clipped.jsonl")
    assert baseline.alerts and not baseline.actions  # fired at the baseline, acting only from a probe of training
    assert first.actions == clip_cb.actions and not first.qk_clip and not second.actions
    # every head (scores in the tens) clipped at step 3; at step 4 those the update left under tau are not
    assert second.qk_clip["tau"] == 1.0 and all(c in (1.0, 2.0) for layer in second.qk_clip["clipped_steps"]
                                                for c in layer)


def test_a_trainer_resumed_from_its_checkpoint_after_actions_goes_on_as_the_uninterrupted_one(tmp_path):
    """The checkpoint at step 3 (taken at probe 2: a clip, a rate cut for 3 steps and a skip of 2, all still in
    force) holds the watch's state in its trainer_state.json; a Trainer resumed from it gives the uninterrupted
    run's weights, losses, actions and watch log at steps 4 to 6, to the bit."""
    alerts = [MaxScore(tau=ANY, action=a) for a in (ClipQK(1.0), ScaleLR(0.5, steps=3), SkipStep(2))]
    whole_cb, whole, whole_losses = _acting(tmp_path, "whole", alerts, steps=6, save_strategy="steps", save_steps=3)
    checkpoint = tmp_path / "whole" / "out" / "checkpoint-3"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["WatchCallback"]
    assert saved["args"] == {} and saved["attributes"]["watch_state"]
    resumed_cb, resumed, resumed_losses = _acting(tmp_path, "resumed", alerts, steps=6, resume=str(checkpoint))
    assert sorted(resumed) == [4, 5, 6] and all(_equal(resumed[k], whole[k]) for k in resumed)
    # the skip spanned the checkpoint: step 4 moved no weight but those the clip scales
    unclipped = [k for k in whole[4] if "q_proj" not in k and "k_proj" not in k]
    assert all(torch.equal(whole[4][k], whole[3][k]) for k in unclipped)
    assert not all(torch.equal(whole[5][k], whole[4][k]) for k in unclipped)
    assert {k: resumed_losses[k] for k in (4, 5, 6)} == {k: whole_losses[k] for k in (4, 5, 6)}
    assert resumed_cb.actions == whole_cb.actions and len(whole_cb.actions) == 3
    assert _lines(tmp_path / "resumed.jsonl", (4, 6)) == _lines(tmp_path / "whole.jsonl", (4, 6))
    with pytest.raises(ConfigError, match="^restore_callback_states_from_checkpoint makes a WatchCallback without"):
        _acting(tmp_path, "restored", alerts, steps=6, resume=str(checkpoint), restore_callback_states_from_checkpoint=True)


def test_one_callback_given_to_a_second_trainer_of_another_model_is_refused_before_its_first_step(tmp_path):
    """It would keep probing the first model and log the second run with the first's numbers."""
    callback = WatchCallback(every=1, alerts=(), report=False)
    _trainer(tmp_path / "a", callback, "none", steps=1).train()
    second = _trainer(tmp_path / "b", callback, "none", steps=2)
    with pytest.raises(ConfigError, match=r"this WatchCallback already followed LlamaForCausalLM; a watch follows one "
                                          r"model: give each model its own WatchCallback\(\.\.\.\)"):
        second.train()
    assert second.state.global_step == 0


def test_an_integration_that_fails_at_the_end_costs_neither_the_run_nor_the_watchs_log(tmp_path, monkeypatch, caplog):
    """TensorBoard's writer on a full disk: the watch's copy fails when it closes; the Trainer's run ends, and
    the watch's own log is closed with every probe."""
    import errno

    from transformers.integrations import TensorBoardCallback

    own_end = TensorBoardCallback.on_train_end

    def full(self, *args, **kwargs):
        own_end(self, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    callback = WatchCallback(every=2, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")])
    trainer = _trainer(tmp_path, callback, ["tensorboard"])
    def integrations(args):
        copy = type("Full", (TensorBoardCallback,), {"on_train_end": full})()
        copy.logging_dir = str(tmp_path / "out" / "runs" / "full")  # as _integrations sets it: never the cwd's runs/
        return [copy]

    monkeypatch.setattr(callback, "_integrations", integrations)
    trainer.train()
    assert trainer.state.global_step == 4 and callback.watch.closed
    assert [line.step for line in read_log(tmp_path / "w.jsonl")] == [0, 2, 4]
    said = [r.getMessage() for r in caplog.records if "failed in on_train_end" in r.getMessage()]
    assert len(said) == 1 and "No space left on device" in said[0]


def test_clip_qk_on_a_model_with_a_q_norm_is_refused_before_the_first_step(tmp_path):
    """A q_norm after the projection (Qwen3, OLMo 2 and Gemma 3 have one) undoes any scaling of W_q: the alert's
    ClipQK is refused when the Trainer begins, not at the step after its alarm."""
    callback = WatchCallback(every=3, alerts=[MaxScore(tau=1e-9, action=ClipQK(100))])
    trainer = _trainer(tmp_path, callback, "none", steps=4)
    for layer in trainer.model.model.layers:
        layer.self_attn.q_norm = torch.nn.LayerNorm(layer.self_attn.head_dim)  # as QK-Clip finds a qk-norm
    with pytest.raises(ConfigError, match=r"^MaxScore's action ClipQK\(tau=100\) cannot act on LlamaForCausalLM: "
                                          r".*normalises q or k after the projection \(q_norm\)"):
        trainer.train()
    assert trainer.state.global_step == 0
