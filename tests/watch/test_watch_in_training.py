"""The watch in the training forward: a probe step's numbers are ``measure_heads``' on the step's own batch and
weights, no extra forward runs, gradient accumulation's forwards all count, and evaluations do not."""

import pytest
import torch

from attnscale.capture.probe import measure_heads
from attnscale.errors import ConfigError
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.loop import Watch
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink

CONFIG = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8)  # no dropout


def _batches(steps: int, rows: int = 4):
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 40, (rows, 12), generator=gen) for _ in range(steps)]


def _counted(model) -> list[int]:
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def _train(model, watch, batches, pieces: int = 1, before=None):
    """SGD steps, each over ``pieces`` accumulated forwards; ``before(step, batch)`` runs before the step's forward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step, batch in enumerate(batches, 1):
        if before is not None:
            before(step, batch)
        for piece in batch.chunk(pieces):
            torch.nn.functional.cross_entropy(model(piece).flatten(0, 1), piece.flatten()).backward()
        opt.step()
        opt.zero_grad()
        watch.step(step)


def test_the_training_forward_gives_measure_heads_numbers_with_no_extra_forward(tmp_path):
    model = build_model(CONFIG, seed=0)
    expected = {}
    forwards = _counted(model)
    batches = _batches(4)
    with Watch(model, every=2, alerts=(), in_training_forward=True, sinks=[JsonlSink(tmp_path / "w.jsonl")]) as watch:
        def before(step, batch):
            if step % 2 == 0 or step == 1:  # the weights the step's forward sees (step 1's: the baseline's)
                expected[0 if step == 1 else step] = measure_heads(model, batch)
                forwards.pop()  # measure_heads' own forward, not the watch's
        _train(model, watch, batches, before=before)
    assert len(forwards) == 4  # one forward a step: the watch ran none
    records = read_log(tmp_path / "w.jsonl")
    assert [r.step for r in records] == [0, 2, 4]
    for r in records:
        torch.testing.assert_close(torch.tensor(r.values), expected[r.step].values_LMH, rtol=1e-5, atol=1e-6)
        assert r.rows == expected[r.step].rows_LH.tolist()
        assert r.probe == {"forwards": 1, "sequences": 4, "tokens": 12, "methods": ["replay", "replay"]}  # every row
    assert not watch.training.armed  # closed: nothing left hooked


def test_the_default_probe_runs_one_extra_forward_a_probe():
    model = build_model(CONFIG, seed=0)
    forwards = _counted(model)
    with Watch(model, every=2, alerts=()) as watch:
        _train(model, watch, _batches(4))
    assert len(forwards) == 4 + 2 + 1  # and the probe tried once, on the first batch, before its forward


def test_every_accumulated_forward_counts_as_one_forward_of_their_batches_together():
    model = build_model(CONFIG, seed=0)
    batches = _batches(1, rows=6)
    whole = measure_heads(model, batches[0])
    with Watch(model, every=1, alerts=(), in_training_forward=True) as watch:
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for piece in batches[0].chunk(3):
            model(piece).sum().backward()
        model.eval()
        with torch.no_grad():
            model(batches[0][:1])  # an evaluation between the forwards and the step: not counted
        model.train()
        opt.step()
        numbers = watch.step(1)
    assert numbers["attn/max_score"] == pytest.approx(whole.summary()["attn/max_score"], rel=1e-6)
    got = [[numbers[f"attn/layer_{l}/head_{h}/{m}"] for h in range(2)] for l in range(2) for m in whole.measures]
    torch.testing.assert_close(torch.tensor(got).view(2, -1, 2), whole.values_LMH, rtol=1e-5, atol=1e-6)


def test_between_probe_steps_nothing_is_hooked():
    model = build_model(CONFIG, seed=0)
    with Watch(model, every=3, alerts=(), in_training_forward=True) as watch:
        armed = []
        for step in range(1, 7):
            armed.append(watch.training.armed)
            model(_batches(1)[0]).sum().backward()
            watch.step(step)
    # before a probe step's forward, and before the first step's, where the capture is tried once
    assert armed == [True, False, True, False, False, True]
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_a_resumed_loop_arms_for_its_next_step():
    model = build_model(CONFIG, seed=0)
    with Watch(model, every=5, alerts=(), in_training_forward=True) as watch:
        watch.expect(10)  # resumed after step 9
        model(_batches(1)[0]).sum().backward()
        assert watch.step(10) is not None


def test_a_probe_step_without_a_training_forward_is_one_clear_error():
    model = build_model(CONFIG, seed=0)
    with Watch(model, every=1, alerts=(), in_training_forward=True) as watch:
        with torch.no_grad():
            model(_batches(1)[0])
        with pytest.raises(ConfigError, match="no training forward of TinyLM.forward before step 1"):
            watch.step(1)


def test_with_qk_clip_both_read_the_same_training_forward(tmp_path):
    """The record's max_score is the S_max the clip acted on: both captures saw the step's forward."""
    unscaled = ModelConfig(**{**CONFIG.__dict__, "scale": "none", "init": "unit"})
    model = build_model(unscaled, seed=0)
    batches = _batches(2)
    before = {}
    with Watch(model, every=1, alerts=(), in_training_forward=True, qk_clip=2.0, sinks=[JsonlSink(tmp_path / "w.jsonl")]) as watch:
        _train(model, watch, batches, before=lambda step, batch: before.setdefault(step, measure_heads(model, batch)))
    baseline, *records = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.qk_clip == {}  # step 1's forward, before its clip
    for r in records:
        s_max = torch.tensor(r.qk_clip["s_max"])
        torch.testing.assert_close(s_max, before[r.step].get("max_score"), rtol=1e-5, atol=1e-6)
        assert r.summary["attn/max_score"] == pytest.approx(float(s_max.max()), rel=1e-5)
    assert records[0].summary["attn/max_score"] > 2.0 and min(min(g) for g in records[0].qk_clip["gamma"]) < 1


@pytest.mark.parametrize("options, says", [
    ({"in_training_forward": True, "probe": torch.zeros(1, 4, dtype=torch.long)}, "give no probe="),
    ({"stage": 1}, "in_training_forward=True with stage="),
    ({"in_training_forward": True, "layer_offset": 2}, "give stage= too"),
    ({"in_training_forward": True, "stage": -1}, "stage takes a non-negative integer"),
    ({"in_training_forward": "yes"}, "in_training_forward takes True or False"),
])
def test_bad_options_name_the_option(options, says):
    with pytest.raises(ValueError, match=says):
        Watch(build_model(CONFIG, seed=0), **options)
