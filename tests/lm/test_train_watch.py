"""attnscale's own training loop takes the watch as the Trainer and Lightning callbacks do: the probes land at
their steps with the numbers of the weights trained so far, the run's own numbers are untouched, and a "stop"
alert ends the run as "stopped"."""

import re

import pytest
import torch
from safetensors.torch import load_file

from attnscale.core.hooks import hooked
from attnscale.lm.data import batches
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.train import TrainConfig, train
from attnscale.watch.alerts import MaxScore
from attnscale.watch import Attached
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
    assert [line.step for line in lines] == [2, 4, 6]
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
    assert [line.step for line in lines] == [2] and lines[0].alerts
    assert kept.steps == [2] and kept.closed


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
    assert resumed["resumed_from"] == 3 and (first.steps, kept.steps) == ([2], [4, 6])


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
    assert len(said) == 2 and "lost 3 of 3 records" in said[1]


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
