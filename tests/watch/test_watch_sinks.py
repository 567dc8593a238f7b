"""Sinks: the JSONL log read back through its schema, CSV, TensorBoard and W&B offline read back with their readers."""

import csv
import json

import pytest

from attnscale.watch.logs.line import SCHEMA, VERSION, read_log
from attnscale.watch.logs.sinks import CsvSink, JsonlSink, TensorBoardSink, WandbSink, scalars
from watch_lines import MEASURES, record
from watch_readers import tensorboard_scalars, wandb_history


def test_jsonl_lines_carry_schema_and_version_and_read_back_equal(tmp_path):
    sink = JsonlSink(tmp_path / "watch.jsonl")
    sink.write(record(10))
    sink.write(record(20, bump=0.5))
    sink.close()
    lines = (tmp_path / "watch.jsonl").read_text().splitlines()
    assert [json.loads(x)["schema"] for x in lines] == [SCHEMA, SCHEMA]
    assert [json.loads(x)["version"] for x in lines] == [VERSION, VERSION]
    back = read_log(tmp_path / "watch.jsonl")
    assert back == [record(10), record(20, bump=0.5)]
    assert back[1].grid("effective_words") == [[20.5, 21.5], [120.5, 121.5]]


def test_csv_has_one_row_per_step_and_head(tmp_path):
    sink = CsvSink(tmp_path / "watch.csv")
    sink.write(record(10))
    sink.write(record(20))
    sink.close()
    rows = list(csv.DictReader((tmp_path / "watch.csv").open()))
    assert len(rows) == 2 * 2 * 2
    r = next(r for r in rows if r["step"] == "20" and r["layer"] == "1" and r["head"] == "1")
    assert float(r["max_score"]) == 100 + 10 * 1 + 1 and r["rows"] == "59"


def test_scalars_name_every_head_and_measure():
    flat = scalars(record(5))
    assert flat["attn/layer_1/head_0/effective_words"] == 100 + 10 * 2 + 0
    assert sum(k.startswith("attn/layer_") for k in flat) == 2 * 2 * len(MEASURES)
    assert flat["attn/alerts"] == 1 and flat["watch/share"] == 0.001


def test_tensorboard_event_files_hold_the_scalars_at_the_steps(tmp_path):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write(record(10))
    sink.write(record(20, bump=1.0))
    sink.close()
    tb = tensorboard_scalars(tmp_path / "tb")
    assert tb["attn/layer_1/head_1/push"] == {10: pytest.approx(141.0), 20: pytest.approx(142.0)}
    assert tb["attn/max_score"][20] == pytest.approx(112.0)


def test_wandb_offline_writes_the_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the extra attnscale[watch]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(project="attnscale-test", dir=str(tmp_path))
    sink.write(record(10))
    sink.write(record(20, bump=1.0))
    sink.close()
    rows = wandb_history(tmp_path, rows=2)
    assert [(r["_step"], r["attn/layer_0/head_1/spread"]) for r in rows] == [(10, 1.0), (20, 2.0)]
