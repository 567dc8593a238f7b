"""The spread experiment, the course's first measurement: how the scores' spread grows with the head width."""

import math

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import spread


def test_spread_grows_like_sqrt_d_within_sampling_error():
    rows = spread.run(spread.SpreadConfig(head_dims=(4, 64, 256), pairs=20000))
    for r in rows:
        # 4 standard errors: fails by chance about once in 15,000 runs
        assert abs(r["raw_spread"] - math.sqrt(r["head_dim"])) < 4 * r["raw_spread_se"]
        assert r["scaled_spread"] == pytest.approx(1.0, rel=4 * r["raw_spread_se"] / r["raw_spread"])
        # the delta-method SE agrees with the theory: ½·sqrt((2 + 6/d)/n) relative
        theory = 0.5 * math.sqrt((2 + 6 / r["head_dim"]) / r["pairs"]) * math.sqrt(r["head_dim"])
        assert r["raw_spread_se"] == pytest.approx(theory, rel=0.1)


def test_same_seed_same_numbers_and_head_dims_independent():
    a = spread.run(spread.SpreadConfig(head_dims=(8, 32), pairs=500, seed=3))
    b = spread.run(spread.SpreadConfig(head_dims=(32,), pairs=500, seed=3))
    assert a[1] == b[0]
    assert spread.run(spread.SpreadConfig(head_dims=(8,), pairs=500, seed=4))[0] != a[0]


@pytest.mark.parametrize("kwargs, words", [(dict(head_dims=(0,)), r"head_dims must be positive integers, got \(0,\)"),
                                           (dict(head_dims=(-4,)), r"head_dims must be positive integers, got \(-4,\)"),
                                           (dict(pairs=1), "pairs must be at least 2 to measure a spread, got 1"),
                                           (dict(scales=("bogus",)), "unknown scale 'bogus'; choose one of: none, ")])
def test_spread_bad_config_raises(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        spread.SpreadConfig(**kwargs)
