import pytest
import torch

from attnscale import Attention, hook_names, hooked


def test_hook_names_are_pinned():
    assert hook_names(Attention(16, 2, 8)) == ["hook_q", "hook_k", "hook_scores", "hook_pattern", "hook_z"]


def test_record_caches_and_always_removes_hooks():
    attn = Attention(16, 2, 8)
    x = torch.randn(3, 5, 16)
    with hooked(attn, ["hook_scores", "hook_pattern"]) as cache:
        attn(x)
        assert attn.recording
    assert set(cache) == {"hook_scores", "hook_pattern"}
    assert cache["hook_pattern"].shape == (3, 2, 5, 5)
    assert not attn.recording
    with pytest.raises(RuntimeError, match="boom"):
        with hooked(attn, "hook_*"):
            raise RuntimeError("boom")
    assert not attn.recording and all(not m._forward_hooks for m in attn.modules())


def test_record_with_fn_keeps_nothing():
    attn = Attention(16, 2, 8)
    seen = []
    with hooked(attn, "hook_pattern", fn=lambda name, t: seen.append((name, t.shape))) as cache:
        attn(torch.randn(1, 4, 16))
    assert cache == {} and seen == [("hook_pattern", torch.Size([1, 2, 4, 4]))]


def test_unknown_hook_pattern_is_an_error():
    with pytest.raises(ValueError, match="no hook point matches"):
        with hooked(Attention(16, 2, 8), "blocks.*"):
            pass
