"""runs.trainer.train_run: one run trained into its folder (metrics, weights, checkpoint, record)."""

import json
import math
import re

import pytest
import torch

from attnscale.lm.model import TinyLM
from attnscale.lm.train import DIAGNOSTICS, train
from attnscale.runs import record
from attnscale.runs.trainer import train_run
from test_train import mcfg, tcfg  # the tiny configs
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def run(model_cfg, train_cfg, corpus, run_dir, **kw) -> dict:
    """train_run's results as the plain dict train returns, read back from the record."""
    return train_run(model_cfg, train_cfg, corpus, run_dir, **kw).results.to_json()


def test_run_writes_metrics_and_record(tmp_path, corpus):
    seen = []
    res = run(mcfg(), tcfg(), corpus, tmp_path, on_step=lambda s, n, info: seen.append((s, n, info["loss"])))
    assert res["status"] == "done" and res["steps_done"] == 6
    assert [s for s, n, _ in seen] == list(range(1, 7)) and all(n == 6 for _, n, _ in seen)
    # step 0 (before any update), every record_every, and the trained model at the end
    assert [row["step"] for row in res["history"]] == [0, 3, 6]
    for row in res["history"]:
        for k in DIAGNOSTICS:
            assert len(row[k]) == 2 and all(len(layer) == 2 for layer in row[k])
            assert all(isinstance(v, float) for layer in row[k] for v in layer)
    assert math.isfinite(res["perplexity"]) and res["perplexity"] < V * 2
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == json.loads(json.dumps(res["history"]))
    assert all(b["elapsed_s"] >= a["elapsed_s"] for a, b in zip(lines, lines[1:]))
    rec = record.read(tmp_path)
    assert rec.status == "done" and rec.experiment == "train" and rec.schema == record.SCHEMA_VERSION
    assert rec.config["model"]["scale"] == "inv_sqrt_d" and rec.config["train"]["seed"] == 0
    back = record.TrainRun.load(tmp_path)
    assert back.perplexity == pytest.approx(res["perplexity"]) and back.results.start["spread"] > 0


def test_metrics_are_written_fresh_on_restart(tmp_path, corpus):
    (tmp_path / "metrics.jsonl").write_text('{"step": 99}\n' * 5)
    run(mcfg(), tcfg(), corpus, tmp_path)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 3, 6]


def test_nan_loss_marks_diverged_and_keeps_records(tmp_path, corpus, monkeypatch):
    real = TinyLM.forward
    calls = {"n": 0}

    def flaky(self, idx):  # one forward a training step: the fourth step's logits are NaN
        calls["n"] += 1
        out = real(self, idx)
        return out * float("nan") if calls["n"] == 4 else out

    monkeypatch.setattr(TinyLM, "forward", flaky)
    res = run(mcfg(), tcfg(record_every=1), corpus, tmp_path)
    assert res["status"] == "diverged" and res["diverged_at"] == 3 and res["steps_done"] == 3
    assert [row["step"] for row in res["history"]] == [0, 1, 2, 3]
    assert res["history"][-1]["loss"] is None and res["perplexity"] is None
    assert record.read(tmp_path).status == "diverged"


def test_should_stop_ends_early(tmp_path, corpus):
    calls = []
    res = run(mcfg(), tcfg(), corpus, tmp_path, should_stop=lambda: len(calls) >= 2, on_step=lambda *a: calls.append(a))
    assert res["status"] == "stopped" and res["steps_done"] == 2
    assert record.read(tmp_path).status == "stopped"


def test_resume_from_checkpoint_gives_the_uninterrupted_numbers(tmp_path, corpus):
    def numbers(res):
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]], res["perplexity"]

    cfg = tcfg(steps=8, checkpoint_every=2)
    whole = train(mcfg(), cfg, corpus)
    done = []
    cut = run(mcfg(), cfg, corpus, tmp_path, should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    assert cut["status"] == "stopped" and (tmp_path / "checkpoint.pt").exists()
    resumed = run(mcfg(), cfg, corpus, tmp_path)
    assert resumed["resumed_from"] == 4 and resumed["steps_done"] == 8
    assert numbers(resumed) == numbers(whole)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 3, 6, 8] and not (tmp_path / "checkpoint.pt").exists()
    # another config never resumes from this run's checkpoint
    done.clear()
    run(mcfg(), cfg, corpus, tmp_path, should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    assert (tmp_path / "checkpoint.pt").exists()
    other = run(mcfg(), tcfg(steps=8, checkpoint_every=2, seed=3), corpus, tmp_path)
    assert other["resumed_from"] is None
    assert other["notes"] == ["checkpoint.pt belongs to another configuration; trained from step 0"]
    assert record.read(tmp_path).notes == tuple(other["notes"])


def test_a_damaged_checkpoint_is_said_in_the_log_and_the_record(tmp_path, corpus, capsys):
    cfg = tcfg(steps=8, checkpoint_every=2)
    done = []
    run(mcfg(), cfg, corpus, tmp_path, should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # torn: what a full disk or a foreign hand leaves
    capsys.readouterr()
    res = run(mcfg(), cfg, corpus, tmp_path)
    assert res["status"] == "done" and res["resumed_from"] is None and res["steps_done"] == 8
    [note] = res["notes"]
    assert note.startswith("checkpoint.pt could not be read (") and note.endswith("trained from step 0")
    assert record.read(tmp_path).notes == (note,)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnscale: {tmp_path.name}: {note}"]
    # the numbers are those of a run that never had a checkpoint
    assert res["perplexity"] == train(mcfg(), cfg, corpus)["perplexity"]


def test_a_finished_run_keeps_its_final_weights(tmp_path, corpus):
    from safetensors.torch import load_file

    res = run(mcfg(), tcfg(), corpus, tmp_path)
    weights = load_file(str(tmp_path / record.WEIGHTS))
    model = TinyLM(mcfg())
    model.load_state_dict(weights)
    assert set(weights) == set(model.state_dict())
    # the saved model is the trained one: it scores the held-out split as the run did
    from attnscale.lm.train import evaluate

    again = evaluate(model, corpus.valid, tcfg().batch, tcfg().eval_batches)
    assert again["perplexity"] == pytest.approx(res["perplexity"], rel=1e-5)


def test_stopped_and_diverged_runs_keep_no_weights(tmp_path, corpus, monkeypatch):
    calls = []
    res = run(mcfg(), tcfg(), corpus, tmp_path / "stopped", should_stop=lambda: len(calls) >= 2,
              on_step=lambda *a: calls.append(a))
    assert res["status"] == "stopped" and not (tmp_path / "stopped" / record.WEIGHTS).exists()
    real = TinyLM.forward
    monkeypatch.setattr(TinyLM, "forward", lambda self, idx: real(self, idx) * float("nan"))  # the first step blows up
    res = run(mcfg(), tcfg(), corpus, tmp_path / "diverged")
    assert res["status"] == "diverged" and res["diverged_at"] == 0
    assert not (tmp_path / "diverged" / record.WEIGHTS).exists()
    assert (tmp_path / "diverged" / record.RECORD).exists()  # the run is recorded; only its weights are not kept


def test_a_runs_watch_is_built_from_plain_data_or_refused():
    from attnscale.errors import ConfigError
    from attnscale.runs.trainer import build_watch
    from attnscale.watch import ClipQK, ScaleLR

    assert build_watch(None) is None
    w = build_watch({"every": 10, "probe": "records",
                     "alerts": [{"max_score": {"tau": 1e4, "action": {"scale_lr": {"factor": 0.5, "steps": None}}}}]})
    assert w.probe_records and w.options["every"] == 10 and w.options["qk_clip"] is None
    (alert,) = w.options["alerts"]
    assert alert.tau == 1e4 and alert.action == ScaleLR(0.5)
    clip = build_watch({"alerts": [{"max_score": {"tau": 5.0, "action": {"clip_qk": {"tau": 100.0}}}}]})
    assert clip.options["alerts"][0].action == ClipQK(100.0) and not clip.probe_records
    assert build_watch({"qk_clip": 100.0}).options["qk_clip"] == 100.0
    for bad, says in (({"probe": "first"}, "probe: 'records' or None"),
                      ({"alerts": [{"spike": {}}]}, "alerts are {'max_score'"),
                      ({"alerts": [{"max_score": {"tau": 1.0, "action": {"halve": {}}}}]}, "one of clip_qk, scale_lr")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            build_watch(bad)
