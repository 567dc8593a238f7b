"""A model with no attention call, watched every 3 steps in a plain loop: refused before the first update (at the
first forward, where the probe batch is caught and tried; at step 1's watch.step when measuring in the training
forward), never at the first probe step, 3, after training began."""

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.watch.loop import Watch


def _loop(watch_options, seen, steps=4):
    """A loop over an attention-free model; in ``seen``, the steps it finished (update and watch.step done) and
    whether its weights moved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    watch = Watch(model, every=3, **watch_options)
    done = seen["done"] = []
    try:
        for step in range(1, steps + 1):
            x = torch.randint(0, 10, (2, 6))
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            watch.step(step)
            done.append(step)
    finally:
        watch.close()
        seen["moved"] = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_first_batch_is_refused_before_its_forward_and_nothing_is_trained():
    seen = {}
    with pytest.raises(ConfigError, match=r"^no attention call of Sequential was seen \(capture 'functions'\)"):
        _loop({}, seen)
    assert seen == {"done": [], "moved": False}


def test_in_the_training_forward_it_is_refused_at_step_one():
    seen = {}
    with pytest.raises(ConfigError, match=r"^no attention call of Sequential was seen in its training forward before "
                                          r"step 1"):
        _loop({"in_training_forward": True}, seen)
    assert seen["done"] == []
