"""The watch's options, checked when made: each mistake is one ConfigError naming it before any training step,
and a probe that fails during training never ends the run (on_error)."""

import logging
import math

import pytest
import torch

from attnscale.capture.probe import measure_heads
from attnscale.errors import ConfigError
from attnscale.watch.alerts import Collapsed, Frozen, MaxScore, Spike
from attnscale.watch.callbacks.attach import Attached
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink
from attnscale.watch.loop import Watch
from watch_models import IDS, _model


def _train(model, watch, steps: int, before=None) -> int:
    """A plain loop over IDS; returns the optimizer steps taken (an error in it propagates)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    taken = 0
    for step in range(1, steps + 1):
        if before is not None:
            before(step)
        model(IDS).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
        taken += 1
        watch.step(step)
    return taken


class NoAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40)

    def forward(self, idx_BT):
        return self.out(self.emb(idx_BT))


HOSTILE = [
    ({"sinks": "watch.jsonl"}, r"wrap it: sinks=\[JsonlSink\('watch.jsonl'\)\]"),
    ({"sinks": ["watch.jsonl"]}, r"wrap it: sinks=\[JsonlSink\('watch.jsonl'\)\]"),
    ({"alerts": ["max_score"]}, r"MaxScore\(tau=100\)"),
    ({"alerts": "max_score"}, r"MaxScore\(tau=100\)"),
    ({"threshold": -1}, "threshold takes a number between 0 and 1"),
    ({"threshold": 1.0}, "threshold takes a number between 0 and 1"),
    ({"threshold": math.nan}, "threshold takes a number between 0 and 1"),
    ({"sample_rows": 0}, "sample_rows takes an integer of at least 2"),
    ({"sample_rows": 12.0}, "sample_rows takes an integer of at least 2"),
    ({"tensor_parallel": "tp"}, "tensor_parallel takes an attnscale.watch.TensorParallel"),
    ({"adapter": "q_proj"}, r"adapter takes attnscale.watch.Adapter\(modules, read\)"),
    ({"capture": "sdpaa"}, "capture must be one of"),
    ({"qk_clip": math.nan}, "qk_clip takes a positive number"),
    ({"every": 2.5}, "every takes a positive integer"),
    ({"memory": True}, "memory takes a positive integer"),
    ({"detail": "head"}, "detail takes one of"),
    ({"on_error": "ignore"}, "on_error takes one of 'warn', 'stop', 'raise'"),
    ({"drop_keys": "labels"}, "drop_keys takes a tuple"),
    ({"probe": {"input_idz": IDS}}, r"'input_idz' are no arguments of TinyLM.forward \(it takes idx_BT\)"),  # model
    ({"probe": {0: IDS}}, "keys are the forward's keyword arguments"),
    ({"probe": {"input_ids": IDS.float()}}, r"input_ids holds torch.float32 values; token ids are integers"),
    ({"probe": IDS.float()}, "the embedding .tok_emb. of TinyLM takes integer token ids"),  # model
    ({"probe": IDS[:0]}, r"probe batch is empty \(shape \(0, 12\)\)"),
    ({"probe": IDS[:, :0]}, r"probe batch is empty \(shape \(3, 0\)\)"),
    ({"probe": "some text"}, "a probe batch is a tensor"),
]


# found by trying the probe on the model: callbacks do at set-up
NEED_THE_MODEL = ("input_idz", "does not run on", "integer token ids")


@pytest.mark.parametrize("kw, says", HOSTILE)
def test_each_mistake_is_one_config_error_when_the_watch_is_made(kw, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a sink made by mistake would write here
    model = _model()
    with pytest.raises(ConfigError, match=says) as e:
        Watch(model, **{"every": 1, **kw})
    assert "\n" not in str(e.value)  # one line
    assert not model._forward_pre_hooks and not model._forward_hooks  # nothing left on the model
    if not any(word in says for word in NEED_THE_MODEL):
        with pytest.raises(ConfigError, match=says):  # the callbacks take the same options, checked when made
            Attached(**{"every": 1, **kw})


def test_a_model_with_no_attention_fails_before_its_first_step_not_at_step_every():
    model = NoAttention()
    with pytest.raises(ConfigError, match="no attention call of NoAttention was seen"):
        Watch(model, every=50, probe=IDS)
    watch = Watch(model, every=50)  # no probe: the first batch is caught and tried before its forward runs
    steps = []
    with pytest.raises(ConfigError, match="no attention call of NoAttention was seen"):
        _train(model, watch, 3, before=steps.append)
    assert steps == [1]  # the first forward raised: no optimizer step was taken


def test_in_the_training_forward_a_model_with_no_attention_is_told_at_step_1_not_at_step_every():
    model = NoAttention()
    watch = Watch(model, every=50, in_training_forward=True)
    steps = []
    with pytest.raises(ConfigError, match="no attention call of NoAttention was seen in its training forward "
                                          "before step 1"):
        _train(model, watch, 3, before=steps.append)
    assert steps == [1]


def test_a_model_that_is_never_called_is_told_at_the_first_step():
    watch = Watch(_model(), every=50)
    with pytest.raises(ConfigError, match="saw no call of TinyLM.forward before step 1.*probe="):
        watch.step(1)


@pytest.mark.parametrize("make, says", [
    (lambda: MaxScore(tau=math.nan), "MaxScore's tau takes a finite number above 0"),
    (lambda: MaxScore(tau=-3.0), "MaxScore's tau takes a finite number above 0"),
    (lambda: Collapsed(words=0.5), "Collapsed's words takes a finite number above 1"),
    (lambda: Frozen(limit=1.0), "Frozen's limit takes a finite number of at least 0 and below 1"),
    (lambda: Frozen(limit="half"), "Frozen's limit takes a finite number"),
    (lambda: Spike(measure="max_scor"), "Spike's measure takes one of"),
    (lambda: Spike(sigmas=math.inf), "Spike's sigmas takes a finite positive number"),
    (lambda: Spike(window=4.5), "Spike needs integers"),
    (lambda: MaxScore(action="log"), "action is 'warn', 'stop'"),
])
def test_an_alert_that_could_never_fire_is_refused_when_made(make, says):
    with pytest.raises(ConfigError, match=says):
        make()


def test_valid_limits_still_make_alerts():
    assert (MaxScore(tau=100).tau, Frozen(limit=0.0).limit, Collapsed(words=1.5).words) == (100, 0.0, 1.5)


def test_sample_rows_beyond_the_sequence_logs_the_rows_really_measured(tmp_path):
    model = _model()
    with Watch(model, every=1, probe=IDS, alerts=(), sample_rows=1000, sinks=[JsonlSink(tmp_path / "w.jsonl")]) as w:
        w.step(1)
    whole = measure_heads(model, IDS)  # before the training step below moves the weights
    with Watch(model, every=1, alerts=(), sample_rows=5, sinks=[JsonlSink(tmp_path / "s.jsonl")],
               in_training_forward=True) as w:
        _train(model, w, 1)
    baseline, record = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.probe == record.probe
    layers = len(record.values)
    # 12 rows a sequence, not 1000; every row measured is every score replayed
    assert record.probe == {"sequences": 3, "tokens": 12, "sampled_rows": 12, "methods": ["replay"] * layers}
    # every row was measured: the numbers are those of the probe without sampling, and each head counted
    # 3 sequences x 12 causal rows
    torch.testing.assert_close(torch.tensor(record.values), whole.values_LMH, rtol=1e-6, atol=1e-7)
    assert record.rows == whole.rows_LH.tolist()
    first, sampled = read_log(tmp_path / "s.jsonl")  # the baseline and step 1: both read step 1's forward
    assert first.step == 0 and first.values == sampled.values
    # 5 of 12 rows: each (causal SDPA) layer's effective words from the fused call, the rest from the 5 rows
    assert sampled.probe == {"forwards": 1, "sequences": 3, "tokens": 12, "sampled_rows": 5, "methods": ["fused"] * layers}
    assert 0 < max(sampled.rows[0]) <= 3 * 5


class Flaky(torch.nn.Module):
    """A model whose probe forwards (no gradients) fail from a given step on, while training goes on."""

    def __init__(self):
        super().__init__()
        self.inner = _model()
        self.broken = False

    def forward(self, idx_BT):
        if self.broken and not torch.is_grad_enabled():
            raise RuntimeError("probe forward broke\nsecond line")
        return self.inner(idx_BT)


def _flaky_run(on_error, caplog, heal_at=None):
    model = Flaky()
    watch = Watch(model, every=1, alerts=(), on_error=on_error)
    got = []

    def before(step):
        model.broken = step >= 2 and (heal_at is None or step < heal_at)

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        for step in range(1, 6):
            before(step)
            model(IDS).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
            got.append(watch.step(step) is not None)
    watch.close()
    said = [r.getMessage() for r in caplog.records if "probe failed" in r.getMessage()]
    return watch, got, said


def test_warn_says_a_failing_probe_once_and_measures_again_when_it_can(caplog):
    watch, got, said = _flaky_run("warn", caplog, heal_at=4)
    assert got == [True, False, False, True, True]  # every step trained; steps 2 and 3 measured nothing
    assert [s for s, _ in watch.failures] == [2, 3]
    assert said == ["the watch's probe failed at step 2 (RuntimeError: probe forward broke); training goes on "
                    "and the watch tries again at its next probe step (on_error='warn')"]


def test_stop_says_it_once_and_measures_no_more(caplog):
    watch, got, said = _flaky_run("stop", caplog, heal_at=4)
    assert got == [True, False, False, False, False] and not watch.measuring
    assert len(said) == 1 and "measures no more (on_error='stop'); training goes on" in said[0]
    assert [s for s, _ in watch.failures] == [2]


def test_raise_ends_the_run_at_the_failing_probe(caplog):
    with pytest.raises(RuntimeError, match="probe forward broke"):
        _flaky_run("raise", caplog)


def test_a_reduction_that_fails_inside_the_training_forward_never_reaches_it(monkeypatch, caplog):
    import attnscale.watch.in_training as in_training

    model = _model()
    real = in_training.measure_call
    broken = {"on": False}

    def measure_call(*a, **kw):
        if broken["on"]:
            raise FloatingPointError("reduction broke")
        return real(*a, **kw)

    monkeypatch.setattr(in_training, "measure_call", measure_call)
    watch = Watch(model, every=1, alerts=(), in_training_forward=True)
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        assert _train(model, watch, 4, before=lambda step: broken.update(on=step == 3)) == 4
    assert [s for s, _ in watch.failures] == [3]
    assert any("FloatingPointError: reduction broke" in r.getMessage() for r in caplog.records)
    watch.close()
