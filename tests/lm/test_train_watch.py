"""attnscale's own training loop takes the watch as the Trainer and Lightning callbacks do: the probes land at
their steps with the numbers of the weights trained so far, the run's own numbers are untouched, and a "stop"
alert ends the run as "stopped"."""

import json
import re
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from attnscale.core.hooks import hooked
from attnscale.lm.data import batches
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.train import TrainConfig, train
from attnscale.watch.alerts import MaxScore
from attnscale.watch import Attached, ClipQK, ScaleLR, SkipStep
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink, Sink
from reference import head_summary
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)

MODEL = ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4)
TRAIN = TrainConfig(steps=6, batch=4, lr=1e-2, warmup=2, record_every=3, eval_batches=2, threads=1)


def _numbers(res):  # everything the run reports but wall-clock time
    return ([{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]], res["losses"],
            res["perplexity"], res["status"])


def test_the_watch_probes_the_weights_trained_so_far_and_leaves_the_runs_numbers_alone(corpus, tmp_path):
    alone = train(MODEL, TRAIN, corpus)
    log, weights = tmp_path / "watch.jsonl", tmp_path / "w.safetensors"
    steps = []
    watched = train(MODEL, TRAIN, corpus, watch=Attached(every=2, sinks=[JsonlSink(log)], probe_sequences=3),
                    weights=weights, on_step=lambda step, *_: steps.append(step))
    assert _numbers(watched) == _numbers(alone) and watched["notes"] == alone["notes"] == []
    assert steps == list(range(1, TRAIN.steps + 1))  # on_step is still told every step
    lines = read_log(log)
    assert [line.step for line in lines] == [0, 2, 4, 6]  # the baseline, then the probe steps
    # the probe is the first batch the model saw (the seed's generator's first draw), cut to 3 sequences,
    # measured on the weights after step 6: the run's final weights
    x_BT, _ = batches(corpus.train, TRAIN.batch, MODEL.context, torch.Generator().manual_seed(TRAIN.seed))
    model = TinyLM(MODEL)
    model.load_state_dict(load_file(weights))
    with torch.no_grad(), hooked(model, "blocks.*.attn.hook_*") as cache:
        model(x_BT[:3])
    last = lines[-1]
    for layer in range(MODEL.n_layers):
        want = head_summary(cache[f"blocks.{layer}.attn.hook_scores"].double(),
                            cache[f"blocks.{layer}.attn.hook_pattern"].double())
        for measure in ("max_score", "spread", "effective_words"):
            assert last.grid(measure)[layer] == pytest.approx(want[measure], rel=1e-4), (layer, measure)


class Kept(Sink):
    """Keeps the steps it is given, and whether it was closed."""

    def __init__(self):
        self.steps, self.closed = [], False

    def write(self, record):
        self.steps.append(record.step)

    def close(self):
        self.closed = True


def test_a_stop_alert_ends_the_run_at_its_probe_and_the_sinks_are_closed(corpus, tmp_path):
    log, kept = tmp_path / "watch.jsonl", Kept()
    res = train(MODEL, TRAIN, corpus, watch=Attached(every=2, sinks=[JsonlSink(log), kept],
                                                     alerts=[MaxScore(tau=1e-6, action="stop")]))
    assert (res["status"], res["steps_done"], len(res["losses"])) == ("stopped", 2, 2)
    lines = read_log(log)
    assert [line.step for line in lines] == [0, 2] and lines[0].alerts and lines[1].alerts
    assert kept.steps == [0, 2] and kept.closed  # said at the baseline, stopped at the first probe of training


def test_a_watched_run_still_stops_when_asked_and_keeps_its_checkpoint_to_resume(corpus, tmp_path):
    cfg = TrainConfig(**{**TRAIN.__dict__, "checkpoint_every": 2})
    asked = train(MODEL, cfg, corpus, watch=Attached(every=2), should_stop=lambda: True)
    assert (asked["status"], asked["steps_done"]) == ("stopped", 0)
    calls = iter(range(100))
    stopped = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=Attached(every=2),
                    should_stop=lambda: next(calls) >= 3)
    assert stopped["status"] == "stopped" and (tmp_path / "c.pt").exists()
    resumed = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=Attached(every=2))
    assert resumed["resumed_from"] == 2 and _numbers(resumed) == _numbers(train(MODEL, cfg, corpus))


def test_a_resumed_run_takes_a_watch_of_its_own_and_an_attached_that_followed_a_run_is_refused(corpus, tmp_path):
    """Each train() builds its model, so a watch follows one call: a resumed run (here at step 3, every 2,
    measured in the training forward) takes a new one, whose first probe is step 4; one that followed a run
    is refused before any step."""
    from attnscale.errors import ConfigError

    cfg = TrainConfig(**{**TRAIN.__dict__, "checkpoint_every": 3})
    first, kept = Kept(), Kept()
    calls = iter(range(100))
    used = Attached(every=2, sinks=[first], in_training_forward=True)
    train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=used, should_stop=lambda: next(calls) >= 3)
    line = ("this Attached already followed a training run, whose model is gone; give each train() call its own "
            "Attached(...), a resumed run too")
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=used)
    resumed = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt",
                    watch=Attached(every=2, sinks=[kept], in_training_forward=True))
    assert resumed["resumed_from"] == 3 and (first.steps, kept.steps) == ([0, 2], [4, 6])  # one baseline a run


# Alerts that act (watch/actions.py). A flat rate after the warm-up (min_lr_ratio 1) and no weight decay: the
# first k steps of a run are those of a k-step run, so "the weights after step k" is a run of k steps. The
# explicit attention path at every step, as QK-Clip's capture takes it: the runs differ by their actions only.
FLAT = TrainConfig(steps=3, batch=4, lr=1e-2, warmup=2, min_lr_ratio=1.0, weight_decay=0.0, record_every=3,
                   eval_batches=2, threads=1, attention="explicit")
ANY = 1e-9  # a MaxScore level every head passes: the alert fires at the first probe


def _weights(corpus, tmp_path, name, steps, watch=None):
    path = tmp_path / f"{name}.safetensors"
    res = train(MODEL, replace(FLAT, steps=steps), corpus, weights=path, watch=watch)
    return res, load_file(path)


def _s_max(weights, corpus, step):
    """max |score| per (layer, head) in the forward of update ``step`` (1-based), on ``weights``: the batch is
    the seed generator's ``step``-th draw."""
    gen = torch.Generator().manual_seed(FLAT.seed)
    for _ in range(step):
        x_BT, _ = batches(corpus.train, FLAT.batch, MODEL.context, gen)
    model = TinyLM(MODEL)
    model.load_state_dict(weights)
    with torch.no_grad(), hooked(model, "blocks.*.attn.hook_*") as cache:
        model(x_BT)
    return [head_summary(cache[f"blocks.{layer}.attn.hook_scores"].double(),
                         cache[f"blocks.{layer}.attn.hook_pattern"].double())["max_score"]
            for layer in range(MODEL.n_layers)]


def test_clip_qk_taken_at_a_probe_clips_from_the_next_step_and_not_before(corpus, tmp_path):
    """An alert firing at probe step 2 turns QK-Clip on: step 3's update is followed by the clip of each head at
    tau, W_q and W_k rows of head h times sqrt(tau / S_max[h]) with S_max from step 3's own forward (on the
    weights after step 2); steps 1 to 3 train as without it."""
    _, after_2 = _weights(corpus, tmp_path, "two", 2)
    s_max = _s_max(after_2, corpus, 3)
    tau = 0.5 * min(min(heads) for heads in s_max)  # every head is clipped
    alone, after_3 = _weights(corpus, tmp_path, "three", 3)
    log = tmp_path / "watch.jsonl"
    watch = Attached(every=2, sinks=[JsonlSink(log)], alerts=[MaxScore(tau=ANY, action=ClipQK(tau))])
    clipped, got = _weights(corpus, tmp_path, "clipped", 3, watch)
    assert clipped["losses"] == alone["losses"]  # the loss of step k comes from the weights before update k
    probe = read_log(log)[1]  # after the baseline, whose firings act on nothing
    assert clipped["actions"] == [{"step": 2, "action": "clip_qk", "alert": "max_score", "layer": 0, "head": 0,
                                   "value": probe.grid("max_score")[0][0], "tau": tau}]
    assert probe.actions == clipped["actions"]  # the watch log keeps it at its probe step
    d = MODEL.head_dim
    for name, value in got.items():
        want = after_3[name]
        if ".q_proj." in name or ".k_proj." in name:
            layer = int(name.split(".")[1])
            gamma_H = torch.tensor([tau / s for s in s_max[layer]], dtype=torch.float64)
            want = (want.double() * gamma_H.sqrt().repeat_interleave(d).view(-1, *[1] * (want.dim() - 1))).float()
            torch.testing.assert_close(value, want, rtol=1e-5, atol=0)
        else:
            assert torch.equal(value, want), name


def test_scale_lr_halves_the_update_of_the_steps_it_covers(corpus, tmp_path):
    """ScaleLR(0.5, steps=1) at probe step 2: update 3 moves the weights half as far as the run without it (AdamW
    without weight decay: the update is lr times a direction the rate does not change)."""
    _, after_2 = _weights(corpus, tmp_path, "two", 2)
    _, after_3 = _weights(corpus, tmp_path, "three", 3)
    res, got = _weights(corpus, tmp_path, "scaled", 3,
                        Attached(every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.5, steps=1))]))
    assert [(a["step"], a["action"], a["factor"], a["steps"]) for a in res["actions"]] == [(2, "scale_lr", 0.5, 1)]
    for name, value in got.items():
        torch.testing.assert_close(value - after_2[name], (after_3[name] - after_2[name]) / 2, rtol=0, atol=2e-7)
    assert res["history"][0]["lr"] == FLAT.lr / FLAT.warmup  # the schedule's own rates are untouched


def test_a_run_without_a_watch_took_no_action_and_its_record_keeps_those_a_watch_took(corpus, tmp_path):
    from attnscale.runs import record as rec
    from attnscale.runs.trainer import train_run

    assert train(MODEL, FLAT, corpus)["actions"] == []
    run = train_run(MODEL, FLAT, corpus, tmp_path / "run",
                    watch=Attached(every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.25))]))
    kept = json.loads((tmp_path / "run" / rec.RECORD).read_text())["results"]["actions"]
    assert [(a["step"], a["action"], a["factor"], a["steps"]) for a in kept] == [(2, "scale_lr", 0.25, None)]
    assert list(run.results.actions) == kept
    assert rec.TrainResults.from_json({"status": "done", "steps_done": 3}).actions == ()  # a record from before


@pytest.mark.parametrize("actions, qk_clip", [((ClipQK(0.05), ScaleLR(0.5, steps=2)), None), ((SkipStep(2),), None),
                                              ((), 0.05)], ids=["clip-and-rate", "skip", "qk_clip-from-the-start"])
def test_a_run_resumed_after_an_action_goes_on_as_the_uninterrupted_one(corpus, tmp_path, actions, qk_clip):
    """Actions taken at probe step 2 still in force at the checkpoint (step 3): the resumed run's losses,
    records, final weights, actions and watch log equal the uninterrupted run's, to the bit (the clip's counts
    since probe 2 too, for a ClipQK's clip and for qk_clip='s)."""
    cfg = TrainConfig(**{**TRAIN.__dict__, "checkpoint_every": 3})

    def attached(log):
        return Attached(every=2, sinks=[JsonlSink(log)], alerts=[MaxScore(tau=ANY, action=a) for a in actions],
                        qk_clip=qk_clip)

    whole = train(MODEL, cfg, corpus, watch=attached(tmp_path / "whole.jsonl"), weights=tmp_path / "whole.st")
    calls = iter(range(100))
    first = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=attached(tmp_path / "first.jsonl"),
                  should_stop=lambda: next(calls) >= 3)
    assert first["status"] == "stopped" and len(first["actions"]) == len(actions)
    resumed = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=attached(tmp_path / "resumed.jsonl"),
                    weights=tmp_path / "resumed.st")
    assert resumed["resumed_from"] == 3
    assert _numbers(resumed) == _numbers(whole) and resumed["actions"] == whole["actions"] == first["actions"]
    w, r = load_file(tmp_path / "whole.st"), load_file(tmp_path / "resumed.st")
    assert all(torch.equal(w[k], r[k]) for k in w)
    assert _numbers(whole) != _numbers(train(MODEL, cfg, corpus))  # the actions changed the run

    def lines(name):
        return [{k: v for k, v in line.to_json().items() if k not in ("time", "watch")}
                for line in read_log(tmp_path / name)]

    assert lines("first.jsonl") + lines("resumed.jsonl") == lines("whole.jsonl")


def test_a_held_out_evaluation_between_steps_is_no_step_of_the_clip_and_bf16_weights_cannot_be_clipped(corpus, tmp_path):
    """The evaluations of eval_every run the model between steps: the clip does not count their scores, so the
    run's weights are those of the run without them. A bf16 copy of the weights, refreshed from the fp32
    masters at every step, would undo any clip: refused before the first step."""
    from attnscale.errors import ConfigError

    def clipped(name, **changes):
        path = tmp_path / f"{name}.safetensors"
        train(MODEL, replace(TRAIN, **changes), corpus, weights=path,
              watch=Attached(every=2, alerts=[MaxScore(tau=ANY, action=ClipQK(0.5))]))
        return load_file(path)

    plain, evaluated = clipped("plain"), clipped("evaluated", eval_every=1)
    assert all(torch.equal(plain[k], evaluated[k]) for k in plain)
    with pytest.raises(ConfigError, match="^QK-Clip scales the weights a step computes on, and weights 'bf16'"):
        clipped("bf16", dtype="bf16", weights="bf16")


def test_a_checkpoint_s_watch_resumes_only_with_the_alerts_it_had(corpus, tmp_path):
    from attnscale.errors import ConfigError

    cfg = TrainConfig(**{**TRAIN.__dict__, "checkpoint_every": 3})
    calls = iter(range(100))
    train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", should_stop=lambda: next(calls) >= 3,
          watch=Attached(every=2, alerts=[MaxScore(tau=ANY, action=SkipStep())]))
    with pytest.raises(ConfigError, match=r"^the checkpoint's watch had the alerts \[MaxScore\(tau=1e-09, action="
                                          r"SkipStep\(steps=1\)\)\], this one \[NonFinite\(action='warn'\)\]; resume "
                                          r"with the alerts and actions the run started with, or give the watch "
                                          r"resume_actions='new' to end the old ones and start these$"):
        train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=Attached(every=2))


class FullDisk(Sink):
    """A sink on a full disk: every write and its close fail with ENOSPC."""

    def write(self, record):
        raise OSError(28, "No space left on device")

    def close(self):
        raise OSError(28, "No space left on device")


def test_a_sink_on_a_full_disk_never_costs_the_run_its_results(corpus, caplog):
    res = train(MODEL, TRAIN, corpus, watch=Attached(every=2, sinks=[FullDisk()], alerts=()))
    assert res["status"] == "done" and len(res["losses"]) == TRAIN.steps
    said = [r.getMessage() for r in caplog.records if "FullDisk" in r.getMessage()]
    assert len(said) == 2 and "lost 4 of 4 records" in said[1]  # the baseline's and three probes'


def test_a_watch_that_is_no_attached_is_refused_before_anything_is_built(corpus, monkeypatch):
    from attnscale.errors import ConfigError
    from attnscale.lm import train as train_module
    from attnscale.watch import Watch

    monkeypatch.setattr(train_module, "build_run", lambda *a, **k: pytest.fail("the run was built"))
    with pytest.raises(ConfigError, match=r"^train's watch= takes an attnscale.watch.Attached\(\.\.\.\)"):
        train(MODEL, TRAIN, corpus, watch=Watch(TinyLM(MODEL)))
    with pytest.raises(ConfigError, match="got str"):
        train(MODEL, TRAIN, corpus, watch="watch.jsonl")


def test_qk_clip_counts_none_of_the_held_out_evaluations_between_steps(corpus):
    """The run evaluates its held-out split between steps (eval mode, no gradients): those forwards are no
    training step, and the S_max each probe logs is that of the training forwards alone, as a run with no
    evaluation between its steps logs it."""
    cfg = TrainConfig(**{**TRAIN.__dict__, "eval_every": 1})
    got = []
    for c in (TRAIN, cfg):
        kept = Kept()
        kept.write = lambda record, kept=kept: kept.steps.append(record.qk_clip["s_max"])
        res = train(MODEL, c, corpus, watch=Attached(every=2, sinks=[kept], alerts=(), qk_clip=1e9))
        got.append(kept.steps)
        assert [e["step"] for e in res["evals"]][:2] == ([1, 2] if c is cfg else [])
    assert got[0] == got[1]


def test_a_records_probe_is_named_and_refused_where_it_cannot_probe_the_records(corpus, monkeypatch):
    """``Attached(probe="records")`` probes the sequence the records measure, at record steps: the Watch itself
    gets no probe batch, and a cadence off the record steps (or a training-forward capture) is refused before the
    run is built."""
    from attnscale.errors import ConfigError
    from attnscale.lm import train as train_module

    kept = Attached(every=6, probe="records")
    assert kept.probe_records and kept.options["probe"] is None
    assert not Attached(every=6).probe_records
    with pytest.raises(ConfigError, match="in_training_forward=True measures the step's own forward"):
        Attached(probe="records", in_training_forward=True)
    monkeypatch.setattr(train_module, "build_run", lambda *a, **k: pytest.fail("the run was built"))
    with pytest.raises(ConfigError, match=r"every=4 must be a multiple of record_every=3"):
        train(MODEL, TRAIN, corpus, watch=Attached(every=4, probe="records"))


def _stopped_at_3(corpus, tmp_path, alerts):
    """A run checkpointed every 3 steps and stopped after step 3, its alert's action taken at probe 2."""
    cfg = TrainConfig(**{**TRAIN.__dict__, "checkpoint_every": 3})
    calls = iter(range(100))
    first = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", should_stop=lambda: next(calls) >= 3,
                  watch=Attached(every=2, alerts=alerts))
    assert first["status"] == "stopped" and [a["step"] for a in first["actions"]] == [2]
    return cfg


def test_a_resume_with_another_action_is_refused_naming_both_unless_it_says_new(corpus, tmp_path, caplog):
    """The checkpoint's alert carried ClipQK(100), the resumed run's ScaleLR: refused, naming both, before any
    step; with resume_actions='new' the clip in force is said to end and the new action is taken at its alarm."""
    from attnscale.errors import ConfigError

    cfg = _stopped_at_3(corpus, tmp_path, [MaxScore(tau=ANY, action=ClipQK(100))])
    scaled = [MaxScore(tau=ANY, action=ScaleLR(0.5))]
    with pytest.raises(ConfigError, match=re.escape(
            "the checkpoint's watch had the alerts [MaxScore(tau=1e-09, action=ClipQK(tau=100.0))], this one "
            "[MaxScore(tau=1e-09, action=ScaleLR(factor=0.5, steps=None))]; resume with the alerts and actions the "
            "run started with, or give the watch resume_actions='new'")):
        train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt", watch=Attached(every=2, alerts=scaled))
    with caplog.at_level("WARNING", logger="attnscale.watch"):
        resumed = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt",
                        watch=Attached(every=2, alerts=scaled, resume_actions="new"))
    assert resumed["resumed_from"] == 3
    assert "what their actions had in force ends here: QK-Clip at tau 100 since step 3" in caplog.text
    assert [(a["step"], a["action"]) for a in resumed["actions"]] == [(2, "clip_qk"), (4, "scale_lr")]


def test_a_rate_cut_in_force_at_the_checkpoint_is_said_to_end_when_the_run_resumes_without_its_watch(corpus,
                                                                                                     tmp_path):
    cfg = _stopped_at_3(corpus, tmp_path, [MaxScore(tau=ANY, action=ScaleLR(0.5, steps=4))])
    resumed = train(MODEL, cfg, corpus, checkpoint=tmp_path / "c.pt")
    assert resumed["resumed_from"] == 3
    assert ("resumed without the watch the checkpoint's run had: the rate times 0.5 for 3 more step(s) ended at "
            "step 3") in resumed["notes"]


def test_clip_qk_on_a_qk_norm_model_is_refused_before_the_first_step(corpus):
    from attnscale.errors import ConfigError

    steps = []
    with pytest.raises(ConfigError, match=r"^MaxScore's action ClipQK\(tau=100\) cannot act on TinyLM: .*qk-norm"):
        train(replace(MODEL, scale="qk_norm"), TRAIN, corpus, on_step=lambda step, *_: steps.append(step),
              watch=Attached(every=2, alerts=[MaxScore(tau=ANY, action=ClipQK(100))]))
    assert steps == []
