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
