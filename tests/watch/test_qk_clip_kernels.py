"""QK-Clip's S_max from the kernel's own max: flex_attention's ``max_scores`` (through ``AuxRequest``) and
Transformer Engine's ``max_logit``, each checked on the CPU with a stand-in of the same signature (neither gives
its max on the CPU), against every score in float64; and where the kernel refuses, the exact max instead."""

import math

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from torch import nn

from attnscale.capture import flex as flex_capture
from attnscale.watch.clip.qk_clip import QKClip

REAL_FLEX = [flex_module.flex_attention]  # in a list: no capture takes it for a holder
H, D, T = 4, 8, 12


def _scores(query, key, scale, block_mask, enable_gqa):
    """The logits as flex makes them, in float64: q·kᵀ × scale, hidden keys -inf by the block mask's mask_mod."""
    k = key.double().repeat_interleave(query.shape[1] // key.shape[1], dim=1) if enable_gqa else key.double()
    s = (query.double() @ k.mT) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if block_mask is not None:
        B, Hq, Tq, S = s.shape
        idx = (torch.arange(B)[:, None, None, None], torch.arange(Hq)[None, :, None, None],
               torch.arange(Tq)[None, None, :, None], torch.arange(S)[None, None, None, :])
        s = s.masked_fill(~block_mask.mask_mod(*idx).bool(), -math.inf)
    return s


def stand_in_flex(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
                  kernel_options=None, *, return_aux=None):
    """flex_attention's signature and returns, on a device that gives max_scores: dense, differentiable."""
    s = _scores(query, key, scale, block_mask, enable_gqa).to(query.dtype)
    v = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1) if enable_gqa else value
    out = torch.softmax(s, -1) @ v
    if return_aux is not None:
        return out, flex_module.AuxOutput(lse=s.logsumexp(-1) if return_aux.lse else None,
                                          max_scores=s.amax(-1) if return_aux.max_scores else None)
    return (out, s.logsumexp(-1)) if return_lse else out


class FlexLayer(nn.Module):
    def __init__(self, kv_heads=H, ask=None):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(16, H * D), nn.Linear(16, kv_heads * D), nn.Linear(16, kv_heads * D)
        self.kv_heads, self.ask = kv_heads, ask or {}

    def qkv(self, x):
        B = x.shape[0]
        return (self.q_proj(x).view(B, T, H, D).transpose(1, 2), self.k_proj(x).view(B, T, self.kv_heads, D).transpose(1, 2),
                self.v_proj(x).view(B, T, self.kv_heads, D).transpose(1, 2))

    def forward(self, x):
        q, k, v = self.qkv(x)
        mask = flex_module.create_block_mask(lambda b, h, i, j: j <= i, None, None, T, T, device="cpu")
        got = flex_module.flex_attention(q, k, v, block_mask=mask, scale=0.7, enable_gqa=self.kv_heads != H, **self.ask)
        self.got = got
        out = got[0] if isinstance(got, tuple) else got
        return out.transpose(1, 2).reshape(x.shape[0], T, -1)


class Net(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.attn = FlexLayer(**kw)

    def forward(self, x):
        return self.attn(x)


def _by_hand(layer, x, signed):
    """Each head's largest score over the causal keys in float64: signed (the kernel's) or of |score|."""
    with torch.no_grad():
        q, k, _ = layer.qkv(x)
        k = k.double().repeat_interleave(H // k.shape[1], dim=1)
        s = (q.double() @ k.mT) * 0.7
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if signed:
            return s.masked_fill(~causal, -math.inf).amax((0, 2, 3)).tolist()
        return s.masked_fill(~causal, 0).abs().amax((0, 2, 3)).tolist()


def _one_step(model, x):
    clip = QKClip(model, 1e9)
    try:
        model.train()
        model(x).sum().backward()
        clip.step()
        return clip.take()
    finally:
        clip.close()


@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("ask", [{}, {"return_lse": True}, {"return_aux": flex_module.AuxRequest(lse=True)}])
def test_flex_max_scores_are_the_clips_s_max_where_the_device_gives_them(monkeypatch, kv_heads, ask):
    monkeypatch.setattr(flex_module, "flex_attention", stand_in_flex)
    monkeypatch.setattr(flex_capture, "MAX_SCORES_REFUSED", ())
    torch.manual_seed(0)
    model, x = Net(kv_heads=kv_heads, ask=ask), 2 * torch.randn(3, T, 16)
    got = _one_step(model, x)
    assert got["method"] == ["kernel"]
    assert got["s_max"][0] == pytest.approx(_by_hand(model.attn, x, signed=True), rel=1e-5)
    # the model got back what it asked for, and only that
    out = model.attn.got
    if not ask:
        assert torch.is_tensor(out)
    elif "return_lse" in ask:
        assert isinstance(out, tuple) and out[1].shape == (3, H, T)
    else:
        assert isinstance(out[1], flex_module.AuxOutput) and out[1].lse is not None and out[1].max_scores is None


def test_where_flex_refuses_max_scores_the_clip_takes_the_exact_max(monkeypatch):
    """On the CPU (``MAX_SCORES_REFUSED``) nothing is asked of the kernel; a device that raises
    NotImplementedError is asked once and then never again. Both give every score's |max|."""
    asked = []

    def refusing(*args, return_aux=None, **kwargs):
        asked.append(return_aux is not None and return_aux.max_scores)
        if return_aux is not None and return_aux.max_scores:
            raise NotImplementedError("Returning max scores is not supported on CPU/MPS.")
        return stand_in_flex(*args, return_aux=return_aux, **kwargs)

    torch.manual_seed(1)
    model, x = Net(), 2 * torch.randn(2, T, 16)
    monkeypatch.setattr(flex_module, "flex_attention", refusing)
    got = _one_step(model, x)
    assert asked == [False] and got["method"] == ["exact"]  # the CPU: not asked
    assert got["s_max"][0] == pytest.approx(_by_hand(model.attn, x, signed=False), rel=1e-5)
    monkeypatch.setattr(flex_capture, "MAX_SCORES_REFUSED", ())
    asked.clear()
    clip = QKClip(model, 1e9)
    try:
        for _ in range(2):
            model(x).sum().backward()
            clip.step()
        got = clip.take()
    finally:
        clip.close()
    assert asked == [True, False, False] and got["method"] == ["exact"]
    assert got["s_max"][0] == pytest.approx(_by_hand(model.attn, x, signed=False), rel=1e-5)


class DotProductAttention(nn.Module):
    """Transformer Engine's DotProductAttention as the clip meets it: its constructor's and forward's names, the
    output [s, b, h·d] in sbhd, and (out, max_logit (h,)) with return_max_logit."""

    def __init__(self, num_attention_heads, kv_channels, attention_dropout=0.0, qkv_format="sbhd",
                 attn_mask_type="causal", softmax_scale=None, return_max_logit=False):
        super().__init__()
        self.num_attention_heads, self.qkv_format, self.return_max_logit = num_attention_heads, qkv_format, return_max_logit
        self.softmax_scale = kv_channels ** -0.5 if softmax_scale is None else softmax_scale

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, attn_mask_type=None,
                core_attention_bias_type="no_bias", core_attention_bias=None, alibi_slopes=None):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query_layer, key_layer, value_layer))  # sbhd -> bhsd
        s = (q @ k.mT) * self.softmax_scale
        s = s.masked_fill(~torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(), -math.inf)
        out = (torch.softmax(s, -1) @ v).permute(2, 0, 1, 3).flatten(2)
        return (out, s.detach().amax((0, 2, 3))) if self.return_max_logit else out


DotProductAttention.__module__ = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"


class TELayer(nn.Module):
    """Megatron's shape: q_proj/k_proj beside TE's core attention, which gets them sbhd."""

    def __init__(self, **kw):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(16, H * D) for _ in range(3))
        self.core_attention = DotProductAttention(H, D, **kw)

    def qkv(self, x):
        return tuple(p(x).view(x.shape[0], T, H, D).transpose(0, 1) for p in (self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x):
        out = self.core_attention(*self.qkv(x))
        return (out[0] if isinstance(out, tuple) else out).transpose(0, 1)


def test_transformer_engines_max_logit_is_the_clips_s_max_and_clips_to_tau():
    torch.manual_seed(2)
    layer, x = TELayer(return_max_logit=True), 3 * torch.randn(2, T, 16)
    with torch.no_grad():
        q, k, _ = (t.permute(1, 2, 0, 3).double() for t in layer.qkv(x))
        s = ((q @ k.mT) * D ** -0.5).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
        want = s.amax((0, 2, 3))
    tau = float(want.min() + want.max()) / 2
    clip = QKClip(layer, tau, capture="sdpa")
    try:
        layer(x).sum().backward()
        factors = clip.step()["core_attention"]
        got = clip.take()
    finally:
        clip.close()
    assert got["layers"] == ["core_attention"] and got["method"] == ["kernel"]
    assert got["s_max"][0] == pytest.approx(want.tolist(), rel=1e-5)
    assert factors.tolist() == pytest.approx(torch.clamp(tau / want, max=1).tolist(), rel=1e-5)  # on the scores
    with torch.no_grad():  # the clipped weights score at most tau
        q, k, _ = (t.permute(1, 2, 0, 3).double() for t in layer.qkv(x))
        after = ((q @ k.mT) * D ** -0.5).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    assert float(after.amax()) <= tau * (1 + 1e-5)
