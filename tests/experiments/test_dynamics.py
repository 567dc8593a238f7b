"""Experiment 3 (dynamics): its config, and a tiny run's records from start to end."""

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import dynamics
from specs import TINY_MODEL, TINY_TRAIN


@pytest.mark.parametrize("bad, words", [(dict(head_dim=0), "head_dim must be a positive integer, got 0"),
                                        (dict(scales=()), r"scales must be distinct scheme names, got \(\)"),
                                        (dict(scales=("nope",)), "model scale 'nope' is unknown"),
                                        (dict(seed=-2), "seed must be a non-negative integer, got -2")])
def test_dynamics_config_rejects_bad_values(bad, words):
    with pytest.raises(ConfigError, match=words):
        dynamics.DynamicsConfig(**bad)


def test_dynamics_run_records_start_and_end(tmp_path):
    cfg = dynamics.DynamicsConfig(head_dim=32, model=TINY_MODEL, train=TINY_TRAIN, seed=1)
    rows = dynamics.run(cfg, tmp_path, progress=False)
    assert [(r["run_id"], r["status"]) for r in rows] == [("d32-none-s1", "done"), ("d32-inv_sqrt_d-s1", "done")]
    none, scaled = rows
    assert none["start"]["spread"] > scaled["start"]["spread"]  # the unscaled scores start louder
    assert none["valid_ppl"] > 1 and none["end"]["effective_words"] >= 1
    from attnscale.runs import record

    assert record.read(tmp_path / "d32-none-s1").group == "dynamics"
    text = dynamics.format_table(rows)
    assert "d32" not in text and "→" in text
    # schemes by the names readers know (the report's), not the registry's keys
    assert [line.split()[1] for line in text.splitlines()[1:3]] == ["none", "1/√d"]
