"""Watch in a plain PyTorch loop, end to end: the tiny LM on the embedded corpus, real sinks read back."""

import torch

from attnscale.core import hooks
from attnscale.core.diagnostics import HEAD_MEASURES
from reference import head_summary
from attnscale.lm.data import batches, load_corpus
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.alerts import MaxScore
from attnscale.watch.loop import Watch
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink, TensorBoardSink
from watch_readers import tensorboard_scalars

import pytest


def _train(model, steps: int, watch: Watch | None = None, seed: int = 0) -> list[int]:
    """A plain loop: AdamW, batches of 6 windows of 16 characters. Returns the steps the watch measured."""
    corpus = load_corpus("default")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    measured = []
    for step in range(1, steps + 1):
        x, y = batches(corpus.train, 6, 16, gen)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if watch is not None:
            if watch.step(step) is not None:
                measured.append(step)
            if watch.should_stop:
                break
    return measured


def _model(scale="inv_sqrt_d", head_dim=None, init="torch"):
    vocab = load_corpus("default").vocab_size
    return build_model(ModelConfig(vocab_size=vocab, context=16, d_model=32, n_layers=2, n_heads=2,
                                   head_dim=head_dim, scale=scale, init=init), seed=0)


def test_a_plain_loop_writes_jsonl_and_tensorboard_at_the_probe_steps(tmp_path):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    model = _model()
    with Watch(model, every=2, sinks=[JsonlSink(tmp_path / "w.jsonl"), TensorBoardSink(tmp_path / "tb")]) as watch:
        assert _train(model, 6, watch) == [2, 4, 6]
    records = read_log(tmp_path / "w.jsonl")
    assert [r.step for r in records] == [2, 4, 6]
    assert records[0].probe == {"sequences": 4, "tokens": 16}  # the first batch, cut to 4 sequences
    tb = tensorboard_scalars(tmp_path / "tb")
    for layer in range(2):
        for head in range(2):
            for m, measure in enumerate(HEAD_MEASURES):
                tag = f"attn/layer_{layer}/head_{head}/{measure}"
                assert tb[tag] == pytest.approx({r.step: r.values[layer][m][head] for r in records}, rel=1e-6)
    # the watch's own time: it grows, and its share of the wall time is a share
    totals = [r.watch["total_seconds"] for r in records]
    assert totals == sorted(totals) and all(0 < r.watch["share"] <= 1 for r in records)
    assert all(r.watch["seconds"] <= r.watch["total_seconds"] for r in records)


def test_the_last_record_equals_the_heads_measured_from_the_models_own_hook_points(tmp_path):
    """Independent path: the tiny LM's hook_scores and hook_pattern on the probe, reduced by head_summary."""
    model = _model()
    with Watch(model, every=3, sinks=[JsonlSink(tmp_path / "w.jsonl")]) as watch:
        _train(model, 3, watch)
        probe = watch.probe
    last = read_log(tmp_path / "w.jsonl")[-1]
    model.eval()
    with torch.no_grad(), hooks.hooked(model, ["blocks.*.attn.hook_scores", "blocks.*.attn.hook_pattern"]) as cache:
        model(probe)
    for layer in range(2):
        want = head_summary(cache[f"blocks.{layer}.attn.hook_scores"], cache[f"blocks.{layer}.attn.hook_pattern"])
        for m, measure in enumerate(HEAD_MEASURES):
            assert last.values[layer][m] == pytest.approx(want[measure], rel=1e-5, abs=1e-7), measure


def test_the_watch_leaves_training_as_it_was():
    """Same seed with and without the watch: the same weights (no grad, no mode change, no RNG drawn)."""
    plain, watched = _model(), _model()
    _train(plain, 4)
    with Watch(watched, every=1, alerts=()) as watch:
        _train(watched, 4, watch)
    assert watched.training
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)


def test_an_unscaled_wide_model_fires_max_score_and_stop_ends_the_loop(tmp_path, caplog):
    """No 1/sqrt(d) at d = 1024 with unit-variance q and k: scores of spread ~sqrt(1024) = 32, so the
    largest of 4·16·16 per head passes QK-Clip's 100 at once; the scaled twin stays far below."""
    unscaled = _model(scale="none", head_dim=1024, init="unit")
    with Watch(unscaled, every=2, alerts=[MaxScore(action="stop")], sinks=[JsonlSink(tmp_path / "w.jsonl")]) as watch:
        measured = _train(unscaled, 10, watch)
    assert measured == [2] and watch.should_stop
    record = read_log(tmp_path / "w.jsonl")[0]
    worst = max(max(layer[HEAD_MEASURES.index("max_score")]) for layer in record.values)
    assert worst > 100 and record.alerts and all(a["step"] == 2 for a in record.alerts)
    assert "attention alert at step 2" in caplog.text
    scaled = _model(head_dim=1024, init="unit")
    with Watch(scaled, every=2, alerts=[MaxScore(action="stop")]) as watch:
        assert _train(scaled, 4, watch) == [2, 4] and not watch.should_stop


def test_a_given_probe_is_used_and_no_hook_is_left():
    model = _model()
    probe = torch.zeros(8, 16, dtype=torch.long)
    watch = Watch(model, every=1, probe=probe, probe_sequences=2)
    assert watch.probe.shape == (2, 16) and not model._forward_pre_hooks
    caught = Watch(model, every=1)
    assert len(model._forward_pre_hooks) == 1
    caught.close()
    assert not model._forward_pre_hooks


@pytest.mark.parametrize("kw, says", [({"every": 0}, "every"), ({"threshold": 1.5}, "threshold"),
                                      ({"probe_sequences": 0}, "probe_sequences")])
def test_bad_options_name_themselves(kw, says):
    with pytest.raises(ValueError, match=says):
        Watch(_model(), **kw)
