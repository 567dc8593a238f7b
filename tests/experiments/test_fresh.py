"""The fresh-head experiment: at unit init, how much of a row's weight one word takes, with and without the scale."""

import json

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import fresh


def test_fresh_unit_init_reproduces_the_chapter():
    res = fresh.run(fresh.FreshConfig(head_dims=(256, 1024), sequences=100))
    by = {(r["head_dim"], r["scale"]): r for r in res["rows"]}
    # width 256, no scale: rows sit on one word; with the scale they spread over tens of words
    assert by[256, "none"]["effective_words_median"] < 1.5
    assert by[256, "inv_sqrt_d"]["effective_words_p10"] < 35 < by[256, "inv_sqrt_d"]["effective_words_p90"]
    # width 1024: "seven rows in ten" frozen without the scale, none with it
    assert 0.6 < by[1024, "none"]["frozen_fraction"] < 0.8
    assert by[1024, "inv_sqrt_d"]["frozen_fraction"] == 0.0
    assert by[1024, "none"]["push_median"] < 0.01 < by[1024, "inv_sqrt_d"]["push_median"]
    # the example row is the same row of the same head under both schemes
    assert by[256, "none"]["example"].split(" puts")[0] == by[256, "inv_sqrt_d"]["example"].split(" puts")[0]


def test_fresh_model_init_runs_and_records_its_init(tmp_path):
    res = fresh.run(fresh.FreshConfig(head_dims=(32,), sequences=8, init="model"), out=tmp_path)
    assert res["model_init"]
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["experiment"] == "fresh" and record["config"]["init"] == "model"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # experiments return data; report/ draws


def test_illustration_goes_from_blend_to_one_word():
    ill = fresh.illustration(64, multipliers=(0.25, 32))
    assert ill["effective_words"][0] > 50 and ill["effective_words"][1] < 2


@pytest.mark.parametrize("kwargs, words", [(dict(words=0), r"words must be at least 2 \(a row needs a choice\), got 0"),
                                           (dict(init="xavier"), "init must be 'unit' or 'model', got 'xavier'"),
                                           (dict(threshold=1.5), "threshold must lie between 0 and 1, got 1.5"),
                                           (dict(head_dims=()), r"head_dims must be positive integers, got \(\)")])
def test_fresh_bad_config_raises(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        fresh.FreshConfig(**kwargs)
