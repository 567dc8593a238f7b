"""What reaches the loggers: every head, a line per layer or the model's summaries (``detail``), and the layer ×
head heatmaps (``images``), read back with TensorBoard's own reader and from a W&B offline run; the per-layer
reductions against numbers worked out by hand; the JSONL log keeps every head whatever the detail."""

import csv
import io
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscale.lm.model import build_model
from attnscale.watch.logs.heatmaps import heatmap
from attnscale.watch.logs.line import WatchLine, read_log
from attnscale.watch.logs.sinks import CsvSink, JsonlSink, TensorBoardSink, WandbSink, scalars
from attnscale.watch.loop import Watch
from watch_models import TWO_LAYERS as CONFIG
from watch_readers import tensorboard_scalars, wandb_history

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def record(step: int = 7) -> WatchLine:
    """2 layers × 3 heads; layer 1's head 2 measured nothing (NaN). Rows: layer 0 counts 10, 30, 60."""
    table = {  # measure -> [layer][head]
        "spread": [[1.0, 2.0, 6.0], [4.0, 8.0, math.nan]],
        "max_score": [[3.0, 9.0, 5.0], [20.0, 10.0, math.nan]],
        "effective_words": [[4.0, 1.5, 8.0], [2.0, 3.0, math.nan]],
        "frozen_fraction": [[0.5, 0.1, 0.0], [0.2, 0.6, math.nan]],
        "push": [[0.3, 0.6, 0.9], [0.1, 0.2, math.nan]],
        "max_weight": [[0.4, 0.5, 0.9], [0.7, 0.8, math.nan]],
    }
    values = [[table[m][layer] for m in MEASURES] for layer in range(2)]
    return WatchLine(step=step, time=1_700_000_000.0, measures=MEASURES, values=values,
                     rows=[[10.0, 30.0, 60.0], [50.0, 150.0, 0.0]],
                     summary={"attn/max_score": 20.0, "attn/min_effective_words": 1.5, "attn/frozen_fraction": 0.3,
                              "attn/collapsed_heads": 1.0},
                     watch={"seconds": 0.01, "total_seconds": 0.02, "share": 0.001},
                     probe={"sequences": 4, "tokens": 12}, threshold=0.99)


# worked out by hand from record(): the largest max_score, the fewest effective words, the frozen share of the
# layer's rows, the mean over heads of the rest (layer 1's head without a value left out)
BY_HAND = {
    0: {"spread": 3.0, "max_score": 9.0, "effective_words": 1.5, "frozen_fraction": (0.5 * 10 + 0.1 * 30) / 100,
        "push": 0.6, "max_weight": 0.6},
    1: {"spread": 6.0, "max_score": 20.0, "effective_words": 2.0, "frozen_fraction": (0.2 * 50 + 0.6 * 150) / 200,
        "push": 0.15, "max_weight": 0.75},
}
SUMMARY_KEYS = {"attn/max_score", "attn/min_effective_words", "attn/frozen_fraction", "attn/collapsed_heads",
                "attn/alerts", "watch/seconds", "watch/total_seconds", "watch/share"}


def test_layers_reduce_each_measure_as_fits_it():
    flat = scalars(record(), "layers")
    for layer, expected in BY_HAND.items():
        for measure, value in expected.items():
            assert flat[f"attn/layer_{layer}/{measure}"] == pytest.approx(value, rel=1e-12), (layer, measure)
    assert not any("/head_" in k for k in flat)
    assert set(flat) - {f"attn/layer_{l}/{m}" for l in range(2) for m in MEASURES} == SUMMARY_KEYS


def test_summary_keeps_the_model_wide_numbers_only_and_heads_every_head():
    assert set(scalars(record(), "summary")) == SUMMARY_KEYS
    heads = scalars(record(), "heads")
    assert heads["attn/layer_1/head_0/max_score"] == 20.0
    assert sum("/head_" in k for k in heads) == 2 * 3 * len(MEASURES)
    with pytest.raises(ValueError, match="detail takes one of"):
        scalars(record(), "everything")


def test_bias_and_qk_clip_reduce_per_layer_too():
    r = record()
    r = WatchLine(**{**r.__dict__, "bias": [[[-1.0, 0.0], [-3.0, 2.0], [None, None]], [[None, None]] * 3],
                     "qk_clip": {"tau": 10.0, "layers": ["a", "b"], "gamma": [[1.0, 0.5, 0.8], [1.0, 1.0, 1.0]],
                                 "s_max": [[3.0, 20.0, 12.0], [4.0, 5.0, 6.0]], "clipped_steps": [[0, 2, 1], [0, 0, 0]]}})
    flat = scalars(r, "layers")
    assert (flat["attn/layer_0/bias_min"], flat["attn/layer_0/bias_max"]) == (-3.0, 2.0)
    assert "attn/layer_1/bias_min" not in flat  # layer 1 has no bias
    assert (flat["qk_clip/layer_0/gamma"], flat["qk_clip/layer_0/s_max"], flat["qk_clip/layer_1/s_max"]) == (0.5, 20.0, 6.0)
    assert flat["qk_clip/clipped_heads"] == 2.0 and not any("/head_" in k for k in flat)


def test_a_sink_without_a_detail_takes_the_watch_s_and_the_jsonl_keeps_every_head(tmp_path):
    model = build_model(CONFIG, seed=0)
    own, inherits = CsvSink(tmp_path / "heads.csv", detail="heads"), CsvSink(tmp_path / "summary.csv")
    ids = torch.randint(0, 40, (4, 12), generator=torch.Generator().manual_seed(0))
    with Watch(model, every=1, probe=ids, alerts=(), detail="summary",
               sinks=[own, inherits, JsonlSink(tmp_path / "w.jsonl")]) as watch:
        numbers = watch.step(1)
    assert set(numbers) == SUMMARY_KEYS | {"attn/nonfinite_heads"}  # a live probe counts non-finite heads too
    assert inherits.detail == "summary" and own.detail == "heads"
    [baseline, line] = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and len(line.values) == 2 and len(line.values[0][0]) == 2  # every layer and head
    assert len(list(csv.DictReader((tmp_path / "heads.csv").open()))) == 2 * 2 * 2  # the baseline's too
    [first, row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert first["step"] == "0"
    assert float(row["attn/max_score"]) == pytest.approx(numbers["attn/max_score"]) and row["step"] == "1"


def test_csv_by_layer_holds_the_layer_reductions(tmp_path):
    sink = CsvSink(tmp_path / "layers.csv", detail="layers")
    sink.write(record())
    sink.close()
    rows = list(csv.DictReader((tmp_path / "layers.csv").open()))
    assert [r["layer"] for r in rows] == ["0", "1"] and "head" not in rows[0]
    assert float(rows[1]["frozen_fraction"]) == pytest.approx(BY_HAND[1]["frozen_fraction"])
    assert float(rows[1]["rows"]) == 200.0


def _tensorboard_images(log_dir) -> dict[str, dict[int, np.ndarray]]:
    """{tag: {step: RGB array}} of every image in the event files, decoded from their PNG."""
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    acc.Reload()
    return {tag: {e.step: np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("RGB"))
                  for e in acc.Images(tag)} for tag in acc.Tags()["images"]}


def test_tensorboard_holds_the_layer_scalars_and_the_heatmaps(tmp_path):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    pytest.importorskip("PIL")
    sink = TensorBoardSink(tmp_path / "tb", detail="layers", images=True)
    sink.write(record(7))
    sink.close()
    tb = tensorboard_scalars(tmp_path / "tb")
    assert tb["attn/layer_0/frozen_fraction"] == {7: pytest.approx(BY_HAND[0]["frozen_fraction"])}
    assert not any("/head_" in tag for tag in tb)
    images = _tensorboard_images(tmp_path / "tb")
    assert set(images) == {"attn/heatmap/max_score", "attn/heatmap/effective_words", "attn/heatmap/frozen_fraction"}
    expected, _, _ = heatmap(record().grid("effective_words"), "effective_words")
    assert np.array_equal(images["attn/heatmap/effective_words"][7], expected)


def test_tensorboard_writes_no_image_unless_asked(tmp_path):
    pytest.importorskip("tensorboard")
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write(record())
    sink.close()
    assert _tensorboard_images(tmp_path / "tb") == {}


def test_wandb_offline_holds_the_summaries_and_a_heatmap(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the extra attnscale[watch]
    pytest.importorskip("PIL")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    if "wandb" in sys.modules:  # a fresh wandb settings singleton, so the run goes under tmp_path
        sys.modules["wandb"].teardown()
    sink = WandbSink(project="attnscale-test", dir=str(tmp_path), detail="summary", images=["max_score"])
    sink.write(record(7))
    sink.close()
    [row] = wandb_history(tmp_path, rows=1)
    prefix = "attn/heatmap/max_score/"  # W&B's image record, its fields as nested keys
    image = {k[len(prefix):]: row.pop(k) for k in list(row) if k.startswith(prefix)}
    assert set(row) - {"_step", "_runtime", "_timestamp"} == SUMMARY_KEYS and row["_step"] == 7
    assert image["_type"] == "image-file" and (image["height"], image["width"]) == (2 * 16, 3 * 16)
    assert image["caption"].endswith("3 dark to 20 bright")
    from PIL import Image

    [png] = [p for p in Path(tmp_path).rglob(Path(image["path"]).name) if "latest-run" not in p.parts]
    expected, _, _ = heatmap(record().grid("max_score"), "max_score")
    assert np.array_equal(np.asarray(Image.open(png).convert("RGB")), expected)
