"""QK-Clip is never a silent no-op: its options are checked when it is built, a first step that saw nothing it
can clip is one ConfigError line naming the model or module, and later a layer that went unseen or cannot be read
is one warning naming it (once), while the layers it can read are clipped."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscale.errors import ConfigError
from attnscale.watch.clip.qk_clip import QKClip

C, H, D = 16, 4, 4


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, D).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)


class Normed(Attn):
    def __init__(self):
        super().__init__()
        self.k_norm = nn.LayerNorm(D)


class Two(nn.Module):
    """Two attention layers; ``skip`` leaves the second out of a forward (a layer dropped on purpose)."""

    def __init__(self, second=Attn):
        super().__init__()
        self.first, self.second, self.skip = Attn(), second(), False
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(8.0)  # every head far above tau = 1

    def forward(self, x):
        x = x + self.first(x)
        return x if self.skip else x + self.second(x)


class Manual(nn.Module):
    """Attention written out (softmax of q·kᵀ by hand): no function any capture reads."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x):
        return torch.softmax(self.q_proj(x) @ self.k_proj(x).transpose(-2, -1) / 4, -1) @ x


X = torch.randn(2, 5, C, generator=torch.Generator().manual_seed(0))


def one_line(e):
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,match", [
    ({"tau": float("nan")}, "qk_clip takes a positive number"),
    ({"tau": float("inf")}, "qk_clip takes a positive number"),
    ({"tau": 0}, "qk_clip takes a positive number"),
    ({"tau": -1.0}, "qk_clip takes a positive number"),
    ({"tau": "100"}, "qk_clip takes a positive number"),
    ({"tau": True}, "qk_clip takes a positive number"),
    ({"tau": 10.0, "memory": 0}, "memory takes a positive number of bytes"),
    ({"tau": 10.0, "memory": 1.5}, "memory takes a positive number of bytes"),
    ({"tau": 10.0, "capture": "sdp"}, "capture must be one of"),
    ({"tau": 10.0, "capture": "adapter"}, "needs an adapter"),
    ({"tau": 10.0, "tensor_parallel": "tp"}, "tensor_parallel takes an attnscale.watch.TensorParallel"),
])
def test_options_are_refused_when_it_is_built(kw, match):
    model = Attn()
    with pytest.raises(ConfigError, match=match) as e:
        QKClip(model, **kw)
    one_line(e)
    assert not model._forward_pre_hooks and not model._forward_hooks  # nothing left attached


def test_a_model_that_is_no_module_is_refused():
    with pytest.raises(ConfigError, match="clips a torch.nn.Module, got function") as e:
        QKClip(lambda x: x, 10.0)
    one_line(e)


def test_no_call_before_the_first_step_is_an_error_naming_the_model():
    model = Manual()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        with pytest.raises(ConfigError, match="QK-Clip saw no attention call of Manual \\(capture 'functions'\\)") as e:
            clip.step()
        one_line(e)
    finally:
        clip.close()


def test_a_layer_unseen_later_is_told_once_by_name_and_the_others_are_clipped():
    model = Two()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        assert set(clip.step()) == {"first", "second"}
        model.skip = True
        with torch.no_grad():
            model.first.q_proj.weight.mul_(2.0)  # the first layer over tau again
        second = model.second.q_proj.weight.detach().clone()
        first = model.first.q_proj.weight.detach().clone()
        model(X)
        with pytest.warns(RuntimeWarning, match="QK-Clip saw no call of 'second' since the last step") as got:
            factors = clip.step()
        assert len(got) == 1 and "\n" not in str(got[0].message)
        assert set(factors) == {"first"} and (factors["first"] < 1).all()
        assert torch.equal(model.second.q_proj.weight, second) and not torch.equal(model.first.q_proj.weight, first)
        model(X)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # told once: a week-long run's log is not flooded
            clip.step()
    finally:
        clip.close()


def test_a_step_with_no_call_at_all_after_the_first_warns():
    model = Two()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        clip.step()
        with pytest.warns(RuntimeWarning, match="QK-Clip saw no attention call of Two .* since the last step: nothing "
                                                "was clipped"):
            assert clip.step() == {}
    finally:
        clip.close()


def test_a_layer_it_cannot_read_beside_one_it_can_is_a_warning_naming_it():
    model = Two(second=Normed)
    first = model.first.k_proj.weight.detach().clone()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        with pytest.warns(RuntimeWarning, match="QK-Clip leaves 'second' unclipped: second normalises q or k"):
            factors = clip.step()
        assert set(factors) == {"first"} and not torch.equal(model.first.k_proj.weight, first)
    finally:
        clip.close()


def test_paused_forwards_do_not_count():
    """A probe's forward (inside ``paused``) is no training step: a step after it alone saw nothing."""
    model = Attn()
    clip = QKClip(model, 1.0)
    try:
        with clip.paused():
            model(X)
        with pytest.raises(ConfigError, match="saw no attention call"):
            clip.step()
    finally:
        clip.close()
    assert not model._forward_pre_hooks and not model._forward_hooks
