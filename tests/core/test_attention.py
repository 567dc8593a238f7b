import copy

import pytest
import torch

from attnscale import Attention, hooked
from attnscale.core.attention import attend, build_mask, masked_softmax
from attnscale.core.scales import SCALES

torch.set_num_threads(1)


@pytest.mark.parametrize("scale", sorted(SCALES))
@pytest.mark.parametrize("causal", [True, False])
def test_fused_and_explicit_give_same_outputs_and_gradients(scale, causal):
    torch.manual_seed(0)
    explicit = Attention(32, 4, 16, scale=scale, causal=causal, impl="explicit")
    fused = copy.deepcopy(explicit)
    fused.impl = "fused"
    x1 = torch.randn(2, 9, 32, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    y1, y2 = explicit(x1), fused(x2)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    y1.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-5)
    for (name, p1), p2 in zip(explicit.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_padding_mask_same_in_both_paths_and_fully_masked_rows_are_zero():
    torch.manual_seed(1)
    explicit = Attention(16, 2, 8, causal=False, impl="explicit")
    fused = copy.deepcopy(explicit)
    fused.impl = "fused"
    x = torch.randn(2, 6, 16)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    y1, y2 = explicit(x, keep), fused(x, keep)
    assert torch.isfinite(y1).all() and torch.isfinite(y2).all()
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    with hooked(explicit, ["hook_scores", "hook_pattern"]) as cache:
        explicit(x, keep)
    p = cache["hook_pattern"]
    assert (p[0, :, :, 4:] == 0).all() and (p[1] == 0).all()
    assert torch.allclose(p[0].sum(-1), torch.ones(2, 6))
    assert torch.isinf(cache["hook_scores"][0, :, :, 4:]).all()


def test_causality_through_gradients():
    attn = Attention(16, 2, 8, causal=True, impl="explicit")
    x = torch.randn(1, 7, 16, requires_grad=True)
    attn(x)[0, 3].sum().backward()
    assert (x.grad[0, 4:] == 0).all() and (x.grad[0, :4] != 0).any()


def test_recording_forces_the_explicit_path_and_scores_are_scaled():
    torch.manual_seed(2)
    attn = Attention(16, 1, 64, scale="inv_sqrt_d", causal=False, impl="fused")
    x = torch.randn(1, 5, 16)
    with hooked(attn, ["hook_q", "hook_k", "hook_scores"]) as c:
        attn(x)
    expected = c["hook_q"] @ c["hook_k"].transpose(-2, -1) / 8
    torch.testing.assert_close(c["hook_scores"], expected)


def test_masked_softmax_is_fp32_and_bf16_safe():
    s = torch.randn(2, 1, 4, 4, dtype=torch.bfloat16)
    p = masked_softmax(s, build_mask(4, causal=True))
    assert p.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(2, 1, 4))
    assert (p.triu(1) == 0).all()


def test_causal_path_without_padding_equals_the_reference_bit_for_bit():
    # Attention skips zeroing rows with no visible key when none can exist (causal, no padding)
    # and masks by adding 0 / -inf: the same numbers, forward and backward, as attend()
    from attnscale.core.attention import _attend
    from attnscale.core.scales import get_scale

    torch.manual_seed(0)
    mask = build_mask(12, causal=True)
    grads = []
    for fast in (False, True):
        q, k, v = (torch.randn(2, 3, 12, 8, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
        fn = (lambda *a: _attend(*a, rows_may_be_empty=False)) if fast else attend
        z, scores, pattern = fn(q, k, v, get_scale("inv_sqrt_d", 8), mask)
        (z.square().sum() + pattern.pow(3).sum()).backward()
        grads.append((z, scores, pattern, q.grad, k.grad, v.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def _big_qk_attention():
    """One head whose q and k are 200 in every entry: q·k = 4 · 200² = 160,000, past fp16's 65,504."""
    attn = Attention(4, 1, 4, scale="none", causal=True, impl="explicit")
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj):
            proj.weight.fill_(50.0)
    return attn, torch.ones(1, 3, 4)


def test_fp16_autocast_scores_are_fp32_and_do_not_overflow():
    attn, x = _big_qk_attention()
    with hooked(attn, ["hook_scores", "hook_pattern"]) as c, torch.autocast("cpu", dtype=torch.float16):
        y = attn(x)
    scores = c["hook_scores"]
    assert scores.dtype == torch.float32 and y.dtype == torch.float16
    visible = build_mask(3, causal=True).expand_as(scores)
    assert (scores[visible] == 160_000.0).all()  # 200 and 160,000 are exact in fp16 and fp32
    assert (scores[~visible] == float("-inf")).all()
    torch.testing.assert_close(c["hook_pattern"][0, 0, 2], torch.full((3,), 1 / 3))


def test_fp16_tensors_give_fp32_scores_and_fp16_output():
    q = k = torch.full((1, 1, 3, 4), 200.0, dtype=torch.float16)
    v = torch.randn(1, 1, 3, 4).half()
    from attnscale.core.scales import get_scale

    z, scores, pattern = attend(q, k, v, get_scale("none", 4), build_mask(3, causal=True))
    assert scores.dtype == torch.float32 and z.dtype == torch.float16
    assert torch.isfinite(scores.tril()).all() and scores[0, 0, 2, 0] == 160_000.0


def test_bf16_and_fp32_scores_keep_their_dtype():
    """Only fp16 lacks the range: bf16 and fp32 scores are computed as before, to the last bit."""
    from attnscale.core.scales import get_scale

    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3))
        scale = get_scale("inv_sqrt_d", 8)
        _, scores, _ = attend(q, k, v, scale, None)
        assert scores.dtype == dtype and torch.equal(scores, (q @ k.transpose(-2, -1)) * scale.factor())


def test_bf16_scores_softmax_in_fp32_and_gradients_as_a_cast_before_it_gives():
    # written out: scores cast to fp32, softmax, the weights cast to v's dtype; forward and backward to the bit
    from attnscale.core.scales import get_scale

    scale, mask = get_scale("inv_sqrt_d", 8), build_mask(13, causal=True)
    results = []
    for by_hand in (False, True):
        q, k, v = (torch.randn(2, 3, 13, 8, generator=torch.Generator().manual_seed(i)).bfloat16().requires_grad_()
                   for i in range(3))
        if by_hand:
            scores = (q @ k.transpose(-2, -1)) * scale.factor()
            scores = scores.float().masked_fill(~mask, float("-inf"))
            pattern = torch.softmax(scores, dim=-1)
            z = pattern.to(torch.bfloat16) @ v
        else:
            z, scores, pattern = attend(q, k, v, scale, mask)
        (z.float().square().sum() + pattern.pow(3).sum()).backward()
        results.append((z, scores.float(), pattern, q.grad, k.grad, v.grad))
    assert results[0][2].dtype == torch.float32 and results[0][3].dtype == torch.bfloat16
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_a_listener_sees_q_k_and_the_padding_on_the_fused_path_and_is_removed(monkeypatch):
    torch.manual_seed(3)
    attn = Attention(16, 2, 8, causal=True, impl="fused")
    fused = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: fused.append(1) or sdpa(*a, **k))
    heard = []
    handle = attn.listen(lambda q, k, pad: heard.append((q, k, pad)))
    x, keep = torch.randn(2, 5, 16), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    attn(x, keep)
    with hooked(attn, ["hook_q", "hook_k"]) as c:  # a hook point takes the explicit path: the same q and k
        attn(x, keep)
    assert fused == [1] and len(heard) == 2 and heard[0][2] is keep
    torch.testing.assert_close(heard[0][0], c["hook_q"])
    torch.testing.assert_close(heard[0][1], c["hook_k"])
    handle.remove()
    attn(x)
    assert len(heard) == 2
