"""The watch's examples run at smoke size and write what they say they write."""

import importlib.util
from pathlib import Path

import pytest

from attnscale.watch.record import read_log
from watch_readers import tensorboard_scalars

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """Run an example's main(argv) in this process (a subprocess would spend most of a smoke run
    importing torch again), in tmp_path, offline; return what it printed."""
    monkeypatch.chdir(tmp_path)
    for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(EXAMPLES))

    def _run(script: str, *args: str) -> str:
        spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), EXAMPLES / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main(list(args)) == 0
        return capsys.readouterr().out

    return _run


def test_plain_loop_example_logs_every_probe_to_jsonl_and_tensorboard(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    out = run("plain_loop.py", "--steps", "6", "--every", "3", "--batch", "4", "--context", "16", "--out", "o")
    records = read_log(tmp_path / "o" / "watch.jsonl")
    assert [r.step for r in records] == [3, 6] and "step 6: loss" in out
    tb = tensorboard_scalars(tmp_path / "o" / "tb")
    assert set(tb["attn/layer_1/head_3/effective_words"]) == {3, 6}


def test_plain_loop_example_stops_an_unscaled_model_at_its_first_probe(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    out = run("plain_loop.py", "--steps", "20", "--every", "2", "--batch", "4", "--context", "16",
              "--scale", "none", "--width", "1024", "--init", "unit", "--stop", "--out", "o")
    assert "stopped at step 2 by an alert" in out
    assert read_log(tmp_path / "o" / "watch.jsonl")[-1].alerts


@pytest.mark.hf
def test_hf_trainer_example_runs_and_stops_when_unscaled(tmp_path, run):
    pytest.importorskip("transformers")
    out = run("hf_trainer.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--hidden", "32",
              "--out", "o")
    assert "trained 4 steps" in out and [r.step for r in read_log(tmp_path / "o" / "watch.jsonl")] == [2, 4]
    tb = tensorboard_scalars(tmp_path / "o" / "runs")
    assert set(tb["train/attn/layer_0/head_0/max_score"]) == {2, 4} and set(tb["train/loss"]) == {2, 4}
    out = run("hf_trainer.py", "--steps", "8", "--every", "2", "--batch", "4", "--context", "16", "--hidden", "32",
              "--unscaled", "--init-std", "0.5", "--stop", "--out", "u")
    assert "trained 2 steps" in out


def test_lightning_example_logs_to_its_loggers_and_stops_when_unscaled(tmp_path, run):
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    out = run("lightning_trainer.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--out", "o")
    assert "trained 4 steps" in out and [r.step for r in read_log(tmp_path / "o" / "watch.jsonl")] == [2, 4]
    assert set(tensorboard_scalars(tmp_path / "o" / "tb")["attn/layer_1/head_3/max_score"]) == {2, 4}
    assert "attn/layer_0/head_0/effective_words" in (tmp_path / "o" / "csv" / "metrics.csv").read_text().splitlines()[0]
    out = run("lightning_trainer.py", "--steps", "8", "--every", "2", "--batch", "4", "--context", "16",
              "--scale", "none", "--width", "1024", "--init", "unit", "--stop", "--out", "u")
    assert "trained 2 steps" in out


def test_plain_loop_example_clips_an_unscaled_model(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    run("plain_loop.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--scale", "none",
        "--width", "1024", "--init", "unit", "--qk-clip", "100", "--out", "o")
    records = read_log(tmp_path / "o" / "watch.jsonl")
    assert records[0].qk_clip["tau"] == 100 and min(min(layer) for layer in records[0].qk_clip["gamma"]) < 1
    assert records[-1].summary["attn/max_score"] < records[0].qk_clip["s_max"][0][0] * 2  # held near tau, not free
