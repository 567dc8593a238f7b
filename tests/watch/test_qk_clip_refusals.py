"""QK-Clip is never a silent no-op: its options are checked when it is built, a first step that saw nothing it
can clip is one ConfigError line naming the model or module, and later a layer that went unseen or cannot be read
is one warning naming it (once), while the layers it can read are clipped."""

import inspect
import os
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
    with pytest.raises(ConfigError, match="^QK-Clip's model takes the torch.nn.Module to clip, got function") as e:
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


# --- what a user reads, to the letter, and where -----------------------------------------------------------------


def test_a_tensor_parallel_of_another_type_is_refused_naming_what_it_got():
    with pytest.raises(ConfigError) as e:
        QKClip(Attn(), 1.0, tensor_parallel=["tp"])
    assert str(e.value) == "QK-Clip's tensor_parallel takes an attnscale.watch.TensorParallel, got list"


def test_the_first_step_with_no_call_says_what_to_do_in_so_many_words():
    model = Manual()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        with pytest.raises(ConfigError) as e:
            clip.step()
    finally:
        clip.close()
    assert str(e.value) == (
        "QK-Clip saw no attention call of Manual (capture 'functions') in the forwards before its first step, so it "
        "can clip nothing; the attention must go through attnscale's Attention, transformers' AttentionInterface, "
        "scaled_dot_product_attention, flex_attention or flash-attn, or be given an "
        "adapter=attnscale.watch.Adapter(modules, read)")


def at_callers_line(warned, line: int) -> bool:
    """Every warning points at this file's ``line``. Under mutation testing mutmut's trampoline frames sit
    between QK-Clip's methods, so there only the warnings' number is checked."""
    if "MUTANT_UNDER_TEST" in os.environ:
        return len(warned) > 0
    return {(w.filename, w.lineno) for w in warned} == {(__file__, line)}


def test_a_later_step_with_no_call_warns_in_so_many_words_from_the_callers_line():
    model = Two()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        clip.step()
        with pytest.warns(RuntimeWarning) as got:
            line = inspect.currentframe().f_lineno + 1
            clip.step()
    finally:
        clip.close()
    assert [str(w.message) for w in got] == [
        "QK-Clip saw no attention call of Two (capture 'functions') since the last step: nothing was clipped "
        "(step() must follow a training forward)"]
    assert at_callers_line(got, line)  # the step() that saw nothing


class Three(nn.Module):
    """Three attention layers; ``only_first`` leaves the other two out of a forward."""

    def __init__(self, later=Attn):
        super().__init__()
        self.first, self.second, self.third, self.only_first = Attn(), later(), later(), False
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(8.0)

    def forward(self, x):
        x = x + self.first(x)
        return x if self.only_first else x + self.third(x + self.second(x))


def test_two_layers_unseen_are_each_told_by_name_in_so_many_words():
    model = Three()
    clip = QKClip(model, 1.0)
    try:
        model(X)
        clip.step()
        model.only_first = True
        model(X)
        with pytest.warns(RuntimeWarning) as got:
            line = inspect.currentframe().f_lineno + 1
            clip.step()
    finally:
        clip.close()
    assert at_callers_line(got, line)  # the user's step(), not QK-Clip's own lines
    assert sorted(str(w.message) for w in got) == [
        f"QK-Clip saw no call of {name!r} since the last step (it clipped it before): that layer went unclipped; a "
        "layer skipped on purpose is told once" for name in ("second", "third")]


def test_two_layers_it_cannot_read_are_each_told_by_name():
    model = Three(later=Normed)
    clip = QKClip(model, 1.0)
    try:
        model(X)
        with pytest.warns(RuntimeWarning) as got:
            line = inspect.currentframe().f_lineno + 1
            factors = clip.step()
    finally:
        clip.close()
    assert at_callers_line(got, line)
    assert set(factors) == {"first"}
    assert sorted(str(w.message).split(":")[0] for w in got) == ["QK-Clip leaves 'second' unclipped",
                                                                  "QK-Clip leaves 'third' unclipped"]


class ScoreMod(nn.Module):
    """flex_attention with a score_mod called by the model itself, outside any submodule."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        B, T, _ = x.shape
        q, k = (p(x).view(B, T, H, D).transpose(1, 2) for p in (self.q_proj, self.k_proj))
        return flex_attention(q, k, k, score_mod=lambda s, b, h, i, j: s + (i - j))


def test_a_flex_score_mod_is_refused_naming_the_model_in_so_many_words():
    model = ScoreMod()
    clip = QKClip(model, 1.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex_attention's own advice to compile it
            with pytest.raises(ConfigError) as e:
                model(X)
    finally:
        clip.close()
    assert str(e.value) == (
        "QK-Clip cannot clip 'ScoreMod': its flex_attention score_mod mixes any bias into the scores, and the clip "
        "cannot tell a bias from a score there; train it without qk_clip, or give the bias to SDPA as an additive "
        "mask")


# --- where the rows are looked for: the call's module, then every module above it ----------------------------


class Kernel(nn.Module):
    def forward(self, q, k):
        return F.scaled_dot_product_attention(q, k, k, is_causal=True)


class Wrap(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Kernel()

    def forward(self, q, k):
        return self.inner(q, k)


class Rooted(nn.Module):
    """The projections on the model itself, the kernel two modules down (``wrap.inner``); ``k_out``: the key
    projection's width (not whole heads: the rows cannot be found)."""

    def __init__(self, k_out=C):
        super().__init__()
        self.wq, self.wk, self.wrap = nn.Linear(C, C), nn.Linear(C, k_out), Wrap()

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)
        k = self.wk(x)[..., :C].reshape(B, T, H, D).transpose(1, 2)
        return self.wrap(q, k)


def test_projections_on_the_model_itself_are_found_from_a_kernel_two_modules_down():
    model = Rooted()
    with torch.no_grad():
        q = model.wq(X).view(2, 5, H, D).transpose(1, 2).double()
        k = model.wk(X).view(2, 5, H, D).transpose(1, 2).double()
    s = (q @ k.transpose(-2, -1) / 2).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), 0)
    s_max = s.abs().amax((0, 2, 3))
    tau = float(s_max.min()) / 2  # every head over tau
    wq = model.wq.weight.detach().double().clone()
    clip = QKClip(model, tau)
    try:
        model(X)
        factors = clip.step()
    finally:
        clip.close()
    assert list(factors) == ["wrap.inner"]
    expected = tau / s_max  # gamma_q = gamma_k = tau / S_max: the scores' factor is their product's root
    torch.testing.assert_close(factors["wrap.inner"].double(), expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(model.wq.weight.detach().double(),
                               wq * expected.sqrt().repeat_interleave(D)[:, None], rtol=1e-5, atol=0)


def test_rows_that_do_not_fit_are_refused_naming_the_module_that_holds_them():
    model = nn.Sequential()
    model.add_module("blocks", nn.Sequential())
    model.blocks.add_module("attention", Rooted(k_out=C + 1))
    for holder, where in ((model.blocks.attention, "Rooted"), (model, "blocks.attention")):
        clip = QKClip(holder, 1.0)
        try:
            holder(X)
            with pytest.raises(ConfigError) as e:
                clip.step()
        finally:
            clip.close()
        assert str(e.value).startswith(f"QK-Clip cannot find the rows of 4 heads of width 4 in {where}: ")


def test_an_adapter_that_names_its_calls_itself_is_read_on_the_module_it_gives():
    """The adapter's own name ("head") is no module's; the module it hands over holds the projections."""
    from attnscale.capture.call import AttentionCall
    from attnscale.watch import Adapter

    def read(m, args, kwargs, out):
        x = args[0]
        B, T, _ = x.shape
        q, k = (p(x).view(B, T, H, D).transpose(1, 2) for p in (m.q_proj, m.k_proj))
        return AttentionCall(q, k, is_causal=True, name="head", module=m)

    model = Two()
    clip = QKClip(model, 1.0, adapter=Adapter("first", read))
    try:
        model(X)
        factors = clip.step()
    finally:
        clip.close()
    assert list(factors) == ["head"] and (factors["head"] < 1).all()


def test_an_adapter_that_names_no_module_is_refused_and_leaves_nothing_attached():
    from attnscale.watch import Adapter

    model = Attn()
    with pytest.raises(ConfigError, match="^the adapter names no module of Attn") as e:
        QKClip(model, 1.0, adapter=Adapter("nothing.*", lambda *a: None))
    one_line(e)
    assert not model._forward_pre_hooks and not model._forward_hooks
