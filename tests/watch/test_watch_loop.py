"""Watch in a plain PyTorch loop, end to end: the tiny LM on the embedded corpus, real sinks read back."""

from pathlib import Path

import torch

from attnscale.core import hooks
from attnscale.errors import ConfigError
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
    assert [r.step for r in records] == [0, 2, 4, 6]  # the baseline, then the probe steps
    assert records[0].probe == {"sequences": 4, "tokens": 16, "methods": ["replay"] * len(records[0].values)}  # the first batch, cut to 4 sequences, every row replayed
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
    baseline, record = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.alerts  # said and recorded at the baseline, stopped at step 2
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


def _small():
    from watch_models import CONFIG

    return build_model(CONFIG, seed=0)


def _ids():
    from watch_models import IDS

    return IDS


class Full(JsonlSink):
    """A JSONL log on a full disk: its file's writes fail with ENOSPC (as /dev/full's do), its close too."""

    def __init__(self, path, close_fails=True):
        super().__init__(path)
        self.close_fails = close_fails

    def write(self, record):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        import errno

        super().close()
        if self.close_fails:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_sink_on_a_full_disk_is_said_once_with_its_lost_records_and_never_ends_the_loop(tmp_path, caplog):
    kept = JsonlSink(tmp_path / "kept.jsonl")
    with Watch(_small(), every=1, probe=_ids(), alerts=(), sinks=[Full(tmp_path / "full.jsonl"), kept]) as watch:
        numbers = [watch.step(step) for step in (1, 2, 3)]  # every probe's numbers still come back
    assert all(n is not None and "attn/max_score" in n for n in numbers)
    assert [line.step for line in read_log(tmp_path / "kept.jsonl")] == [0, 1, 2, 3]  # the other sink lost nothing
    said = [r.getMessage() for r in caplog.records if "full.jsonl" in r.getMessage()]
    assert len(said) == 2, said  # when it first fails, and at the close with its count
    assert "failed at step 0 (OSError: [Errno 28] No space left on device)" in said[0]  # the baseline's
    assert "lost 4 of 4 records" in said[1] and "its close failed too" in said[1]


def test_a_sink_whose_close_fails_is_said_and_the_with_block_ends(tmp_path, caplog):
    class CloseFails(JsonlSink):
        def close(self):
            super().close()
            raise OSError(28, "No space left on device")

    with Watch(_small(), every=1, probe=_ids(), alerts=(), sinks=[CloseFails(tmp_path / "w.jsonl")]) as watch:
        watch.step(1)
    said = [r.getMessage() for r in caplog.records if "w.jsonl" in r.getMessage()]
    assert len(said) == 1 and "its close failed (OSError: [Errno 28] No space left on device)" in said[0]
    assert [line.step for line in read_log(tmp_path / "w.jsonl")] == [0, 1]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_log_on_dev_full_loses_its_records_not_the_run(caplog):
    with Watch(_small(), every=1, probe=_ids(), alerts=(), sinks=[JsonlSink("/dev/full")]) as watch:
        assert watch.step(1) is not None and watch.step(2) is not None
    assert any("lost 3 of 3 records" in r.getMessage() for r in caplog.records)  # the baseline's too


def test_sinks_a_closed_watch_closed_are_refused_by_the_next_one(tmp_path):
    """Two runs sharing one list of sinks: the first closes them, and every probe of the second would fail."""
    sinks = [JsonlSink(tmp_path / "w.jsonl")]
    with Watch(_small(), every=1, probe=_ids(), alerts=(), sinks=sinks) as watch:
        watch.step(1)
    with pytest.raises(ConfigError, match=r"^a sink is closed \(JsonlSink\('.*w\.jsonl'\)\): a watch closes its sinks "
                                          r"when it ends; give each Watch sinks of its own$"):
        Watch(_small(), every=1, probe=_ids(), sinks=sinks)
    closed = JsonlSink(tmp_path / "x.jsonl")
    closed.close()
    with pytest.raises(ConfigError, match="a sink is closed"):
        Watch(_small(), sinks=[closed])


@pytest.mark.parametrize("step", ["2", 2.0, True, torch.tensor(2)])
def test_a_step_that_is_not_an_int_is_refused_at_the_call(step):
    watch = Watch(_small(), every=1, probe=_ids(), alerts=())
    with pytest.raises(ConfigError, match=r"^Watch.step takes the step's number, an int, got "):
        watch.step(step)
    assert watch.step(1) is not None and not watch.failures  # the watch goes on measuring


def test_a_probe_on_which_no_row_sees_two_keys_is_refused_when_tried():
    """A first call of one token would become the probe, and every head would read as measuring nothing."""
    one = _ids()[:, :1]
    with pytest.raises(ConfigError, match=r"no query row of the watch's probe batch sees two keys.*give probe="):
        Watch(_small(), every=1, probe=one)
    model = _small()
    Watch(model, every=1)
    with pytest.raises(ConfigError, match=r"no query row of the watch's probe batch sees two keys.*give probe="):
        model(one)


def test_the_first_probe_is_counted_in_the_watchs_time_and_written_as_the_baseline_of_a_short_run(tmp_path):
    """A probe forward made slow by 50 ms: the first one (on the first batch, before its forward) is the watch's
    time and the baseline record's, which a run shorter than ``every`` still writes, at step 0."""
    import time

    model = _model()
    model.register_forward_pre_hook(lambda m, args: None if m.training else time.sleep(0.05))  # the probe's alone
    with Watch(model, every=100, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")]) as watch:
        x = torch.randint(0, 40, (6, 16))
        model(x)  # the first batch: the probe runs here, before this forward
        assert watch.seconds >= 0.05  # counted at once, not only at the next probe step
        assert _train(model, 3, watch) == []
    [baseline] = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.alerts == [] and baseline.probe["sequences"] == 4
    assert 0.05 <= baseline.watch["seconds"] <= baseline.watch["total_seconds"] <= watch.seconds
    assert 0 < baseline.watch["share"] <= 1
    assert baseline.values == watch.baseline.values


class _Planted(torch.nn.Module):
    """One SDPA call over fixed q and k: head 0 a sink (every query meets key 0), head 1 a previous-token head
    (query i meets key i - 1), head 2 uniform. The input only sets the batch's shape."""

    def __init__(self, T=12, D=8):
        super().__init__()
        q, k = torch.zeros(1, 3, T, D), torch.zeros(1, 3, T, D)
        q[0, 0, :, 0], k[0, 0, 0, 0] = 10.0, 10.0
        for i in range(T):
            q[0, 1, i, (i - 1) % D] = 30.0
            k[0, 1, i, i % D] = 1.0
        self.register_buffer("q", q)
        self.register_buffer("k", k)
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        q, k = (t.expand(x.shape[0], -1, -1, -1) * self.w for t in (self.q, self.k))
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)


def test_the_baseline_record_marks_sink_and_previous_token_heads_and_no_later_record_does(tmp_path):
    model = _Planted()
    with Watch(model, every=2, probe=torch.zeros(2, 12, dtype=torch.long), sinks=[JsonlSink(tmp_path / "w.jsonl")],
               alerts=()) as watch:
        for step in (1, 2):
            watch.step(step)
    baseline, record = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.kinds == [["sink", "previous", ""]]
    assert record.step == 2 and record.kinds == []
    assert "kinds" not in record.to_json()


def test_measure_heads_refuses_a_head_kinds_that_is_no_flag_and_marks_the_heads_when_asked():
    from attnscale.capture.probe import measure_heads

    model, x = _Planted(), torch.zeros(1, 12, dtype=torch.long)
    assert measure_heads(model, x).kinds == ()
    assert measure_heads(model, x, head_kinds=True).kinds == (("sink", "previous", ""),)
    for bad in ("yes", 1, None, bool):
        with pytest.raises(ConfigError, match="head_kinds"):
            measure_heads(model, x, head_kinds=bad)
