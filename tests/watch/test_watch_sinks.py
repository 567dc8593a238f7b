"""Sinks: the JSONL log read back through its schema, CSV, TensorBoard and W&B offline read back with their readers."""

import csv
import json
import math

import pytest

from attnscale.errors import ConfigError
from attnscale.watch.logs.line import SCHEMA, VERSION, WatchLine, read_log
from attnscale.watch.logs.sinks import CsvSink, JsonlSink, TensorBoardSink, WandbSink, scalars
from watch_readers import tensorboard_scalars, wandb_history

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def record(step: int, bump: float = 0.0) -> WatchLine:
    """2 layers × 2 heads; value of (layer l, measure m, head h) = 100 l + 10 m + h + bump."""
    values = [[[100 * l + 10 * m + h + bump for h in range(2)] for m in range(len(MEASURES))] for l in range(2)]
    return WatchLine(step=step, time=1_700_000_000.0 + step, measures=MEASURES, values=values,
                       rows=[[60, 60], [60, 59]], summary={"attn/max_score": 111.0 + bump},
                       alerts=[{"alert": "max_score", "layer": 1, "head": 1, "step": step, "value": 111.0 + bump,
                                "action": "warn", "message": "m"}],
                       watch={"seconds": 0.01, "total_seconds": 0.02, "share": 0.001},
                       probe={"sequences": 4, "tokens": 16}, threshold=0.99)


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


def test_non_finite_values_are_null_in_the_file(tmp_path):
    r = record(1)
    r.values[0][1][0] = math.nan
    line = json.loads(r.to_line())
    assert line["values"][0][1][0] is None


@pytest.mark.parametrize("text, says", [
    ('{"schema": "attnscale.watch", "version": 99, "step": 1}\n', "version 99"),
    ('{"schema": "something.else", "version": 1}\n', "not an attnscale watch record"),
    ("not json\n", ":1 is not JSON"),
    ("", "holds no record"),
    ('{"schema": "attnscale.watch", "version": 1, "step": 1}\n', "lacks a well-formed field"),
])
def test_a_bad_log_is_one_clear_error(tmp_path, text, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as e:
        read_log(path)
    assert "\n" not in str(e.value)


def test_a_missing_log_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="cannot read watch log"):
        read_log(tmp_path / "absent.jsonl")


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
