"""QK-Clip's two promises, and a MaxScore that would fight it. The clip brings the scores it read (the step's
forward, before the update) back to tau; the step's batch read again after the update and the clip
(``qk_clip_check=True``) may pass tau: by the update's size, and by the clip of the layers below it, which moves
a layer's input."""

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.actions import ClipQK, ScaleLR
from attnscale.watch.alerts import MaxScore
from attnscale.watch.callbacks.attach import Attached
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink, scalars
from attnscale.watch.loop import Watch

TAU = 10.0


def _run(tmp_path, lr: float, steps: int = 2):
    """Unscaled heads of width 64 at unit init: every head's S_max about 20, twice tau."""
    model = build_model(ModelConfig(vocab_size=40, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=64,
                                    scale="none", init="unit"), seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ids = torch.randint(0, 40, (4, 8), generator=torch.Generator().manual_seed(0))
    with Watch(model, every=1, probe=ids, alerts=(), sinks=[JsonlSink(tmp_path / f"{lr}.jsonl")], qk_clip=TAU,
               qk_clip_check=True) as watch:
        for step in range(1, steps + 1):
            model(ids).sum().backward()
            opt.step()
            opt.zero_grad()
            watch.step(step)
    return read_log(tmp_path / f"{lr}.jsonl")[1:]  # after the baseline


def test_with_no_update_the_first_layer_comes_back_to_tau_and_the_next_is_moved_by_the_clip_below_it(tmp_path):
    first, second = _run(tmp_path, lr=0.0)
    clip = first.qk_clip
    assert min(min(layer) for layer in clip["s_max"]) > 1.5 * TAU  # every head was over tau, and clipped
    assert clip["s_max_after"][0] == pytest.approx([TAU, TAU], rel=1e-5)  # its input unchanged: the promise
    assert max(clip["s_max_after"][1]) > TAU * 1.01  # layer 0's clip moved layer 1's input
    # what the check read is what the next forward of that batch met
    assert torch.tensor(second.qk_clip["s_max"]) == pytest.approx(torch.tensor(clip["s_max_after"]), rel=1e-5)
    flat = scalars(first, "heads")
    assert flat["qk_clip/layer_0/head_1/s_max_after"] == pytest.approx(TAU, rel=1e-5)
    assert flat["qk_clip/max_s_max_after"] == pytest.approx(max(clip["s_max_after"][1]))


def test_after_an_update_the_scores_of_the_step_may_pass_tau_by_its_size(tmp_path):
    first, _ = _run(tmp_path, lr=1e-2)
    assert first.qk_clip["s_max_after"][0][0] > 1.1 * TAU  # the update moved W_q and W_k of layer 0 after the read
    assert all(g < 1 for layer in first.qk_clip["gamma"] for g in layer)


def test_a_max_score_at_or_under_the_clips_tau_is_refused_naming_the_fight_and_the_fix():
    model = build_model(ModelConfig(vocab_size=40, context=8, d_model=16, n_layers=1, n_heads=2, head_dim=8), seed=0)
    says = r"^MaxScore\(tau=30\) and QK-Clip at tau=30 would fight: .* give MaxScore a tau above the clip's \(e.g. 60"
    with pytest.raises(ConfigError, match=says):
        Watch(model, alerts=[MaxScore(tau=30)], qk_clip=30.0)
    with pytest.raises(ConfigError, match=says):  # a callback says it where it is made
        Attached(alerts=[MaxScore(tau=30)], qk_clip=30.0)
    with pytest.raises(ConfigError, match=r"^MaxScore\(tau=50\) and QK-Clip at tau=100 would fight"):
        Attached(alerts=[MaxScore(tau=1e4, action=ClipQK(100)), MaxScore(tau=50)])  # once the ClipQK is taken
    Watch(model, alerts=[MaxScore(tau=60)], qk_clip=30.0).close()  # above the clip's tau: no fight
    Attached(alerts=[MaxScore(tau=1e4, action=ClipQK(100))])  # the alert that turns the clip on
    Attached(alerts=[MaxScore(tau=1e4, action=ClipQK(100)), MaxScore(tau=50, action=ScaleLR(0.5))])  # acts once


def test_the_check_needs_a_clip_and_a_bool():
    with pytest.raises(ConfigError, match=r"qk_clip_check=True measures QK-Clip's scores after each update: give qk_clip="):
        Attached(qk_clip_check=True)
    with pytest.raises(ConfigError, match="qk_clip_check takes True or False"):
        Attached(qk_clip=10.0, qk_clip_check="yes")
