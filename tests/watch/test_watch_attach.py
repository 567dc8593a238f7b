"""watch.callbacks.attach: what every framework's callback does with a watch, driven here without a framework
(test_watch_hf.py and test_watch_lightning.py drive it through each framework's callback)."""

import pytest
import torch

from attnscale.lm.model import build_model
from attnscale.watch.callbacks.attach import Attached
from watch_models import TWO_LAYERS as CONFIG


def test_the_callbacks_report_what_detail_says():
    callback = Attached(every=1, probe=torch.zeros(2, 12, dtype=torch.long), alerts=(), detail="layers")
    callback.start(build_model(CONFIG, seed=0))
    numbers = callback.after_step(1)
    callback.finish()
    assert "attn/layer_1/max_score" in numbers and not any("/head_" in k for k in numbers)
    with pytest.raises(ValueError, match="detail takes one of"):
        Attached(detail="head")


def test_a_callback_that_followed_one_model_is_refused_on_another():
    """One callback given to a second run of another model would probe the first model and log the second run
    with its numbers: it is refused, naming the fix."""
    from attnscale.errors import ConfigError

    callback = Attached(every=1, probe=torch.zeros(2, 12, dtype=torch.long), alerts=())
    first = build_model(CONFIG, seed=0)
    callback.start(first)
    callback.after_step(1)
    callback.finish()
    with pytest.raises(ConfigError, match=r"^this Attached already followed TinyLM; a watch follows one model: give "
                                          r"each model its own Attached\(\.\.\.\)$"):
        callback.start(build_model(CONFIG, seed=1))


def test_a_second_fit_of_the_same_model_goes_on_into_the_same_sinks(tmp_path):
    """A fit, then a second fit of the same model (resumed at its step): the callback goes on, its log holds both
    fits' probes, and the second's numbers are those of the model as it is then."""
    from attnscale.capture.probe import measure
    from attnscale.watch.logs.line import read_log
    from attnscale.watch.logs.sinks import JsonlSink

    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    callback = Attached(every=1, probe=ids, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")])
    model = build_model(CONFIG, seed=0)
    callback.start(model)
    callback.after_step(1)
    callback.finish()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.mul_(3.0)  # the second fit moved the weights
    callback.start(model, step=1)
    numbers = callback.after_step(2)
    callback.finish()
    lines = read_log(tmp_path / "w.jsonl")
    assert [line.step for line in lines] == [0, 1, 2]  # one baseline: the second fit goes on the first's run
    assert numbers["attn/max_score"] == pytest.approx(measure(model, ids)["attn/max_score"], rel=1e-6)
