"""capture.options: the defaults are valid and frozen, and the probe refuses a bad option or an empty batch
before any forward."""

import pytest

from attnscale.capture.options import WatchOptions
from attnscale.capture.probe import measure, measure_heads
from attnscale.errors import ConfigError
from attnscale.watch.loop import Watch
from watch_models import IDS, _model


@pytest.mark.parametrize("kw, says", [
    ({"threshold": -1}, "threshold takes a number between 0 and 1"),
    ({"tensor_parallel": "tp"}, "tensor_parallel takes"),
    ({"adapter": "q_proj"}, "adapter takes"),
    ({"sample_rows": 1}, "sample_rows takes an integer of at least 2"),
])
def test_measure_refuses_the_same_options_before_any_forward(kw, says):
    calls = []
    model = _model()
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ConfigError, match=says):
        measure(model, IDS, **kw)
    assert calls == []


@pytest.mark.parametrize("batch", [IDS[:0], IDS[:, :0], {"idx_BT": IDS[:0]}])
def test_measure_refuses_an_empty_batch_in_one_line(batch):
    with pytest.raises(ConfigError, match="the probe batch is empty"):
        measure_heads(_model(), batch)


def test_the_defaults_are_valid_and_the_options_are_one_frozen_value():
    options = WatchOptions()
    assert (options.every, options.threshold, options.on_error) == (100, 0.99, "warn")
    with pytest.raises(AttributeError):
        options.every = 3
    watch = Watch(_model(), every=1, probe=IDS, alerts=())
    assert watch.options.probe_sequences == 4 and watch.on_error == "warn"
