"""QK-Clip on every layout it claims, each checked the same way: the q and k weights after one clip equal the
weights before, each head's rows scaled by factors computed here in float64 from the weights (S_max over the
real, visible entries; gamma_q = min(1, tau / S_max), gamma_k over the largest S_max of its group), to 1e-6."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscale.watch.clip.qk_clip import QKClip

C, H, D = 16, 4, 4


def by_hand(q_BHTD, k_BKSD, visible_BTS, scale=None):
    """Each query head's largest |q·k × scale| over the visible entries, float64."""
    q, k = q_BHTD.double(), k_BKSD.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1) * scale).abs()
    return s.masked_fill(~visible_BTS[:, None], 0.0).amax((0, 2, 3))


def gammas(s_max_H, kv_heads, tau):
    gamma_q = (tau / s_max_H).clamp(max=1.0)
    gamma_k = (tau / s_max_H.view(kv_heads, -1).amax(1)).clamp(max=1.0)
    return gamma_q, gamma_k


def rows_scaled(weight, factor_N, dim=0, start=0):
    """``weight`` (float64) with head n's ``D`` outputs from ``start`` on multiplied by ``factor_N[n]``."""
    w = weight.detach().double().clone()
    f = torch.ones(w.shape[dim], dtype=torch.float64)
    f[start:start + len(factor_N) * D] = factor_N.repeat_interleave(D)
    return w * (f[:, None] if dim == 0 else f[None, :])


def close(after, expected):
    torch.testing.assert_close(after.detach().double(), expected, rtol=0, atol=1e-6)


def causal(B, T):
    return torch.ones(B, T, T, dtype=torch.bool).tril()


def tau_between(s_max_H):
    """A tau that clips some heads and leaves others."""
    s = sorted(s_max_H.tolist())
    return (s[1] + s[2]) / 2


def init(module, std=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return module


def check_factors(factors, gamma_q, gamma_k):
    G = len(gamma_q) // len(gamma_k)
    expected = (gamma_q * gamma_k.repeat_interleave(G)).sqrt()
    torch.testing.assert_close(factors.double(), expected, rtol=0, atol=1e-6)


# --- padded batches --------------------------------------------------------------------------------------------


class PaddedNet(nn.Module):
    """Separate q/k projections, SDPA under a causal mask that also hides padded keys (right padding)."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)

    def qk(self, x):
        B, T, _ = x.shape
        return tuple(p(x).view(B, T, H, D).transpose(1, 2) for p in (self.q_proj, self.k_proj))

    def forward(self, x, attention_mask):
        B, T, _ = x.shape
        q, k = self.qk(x)
        v = self.v_proj(x).view(B, T, H, D).transpose(1, 2)
        mask = causal(B, T) & attention_mask.bool()[:, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None]).transpose(1, 2).reshape(B, T, C)


def test_padded_rows_holding_the_largest_score_are_left_out():
    model = init(PaddedNet())
    B, T = 3, 8
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 5:], pad[1, 3:] = False, False
    x[~pad] *= 6.0  # the padded positions' queries make the largest scores
    with torch.no_grad():
        q, k = model.qk(x)
    real = causal(B, T) & pad[:, :, None] & pad[:, None, :]
    every_row = causal(B, T) & pad[:, None, :]
    s_real, s_all = by_hand(q, k, real), by_hand(q, k, every_row)
    assert (s_all > 1.5 * s_real).all()  # read with the padded rows, every head would be clipped far more
    tau = tau_between(s_real)
    gamma_q, gamma_k = gammas(s_real, H, tau)
    wq, wk, bq, bk = (t.detach().clone() for t in (model.q_proj.weight, model.k_proj.weight, model.q_proj.bias,
                                                   model.k_proj.bias))
    clip = QKClip(model, tau)
    try:
        model(x, attention_mask=pad.long())
        factors = clip.step()
    finally:
        clip.close()
    check_factors(factors[""], gamma_q, gamma_k)
    assert (gamma_q == 1).sum() == 2  # the heads under tau are untouched
    close(model.q_proj.weight, rows_scaled(wq, gamma_q.sqrt()))
    close(model.k_proj.weight, rows_scaled(wk, gamma_k.sqrt()))
    close(model.q_proj.bias, rows_scaled(bq[:, None], gamma_q.sqrt())[:, 0])
    close(model.k_proj.bias, rows_scaled(bk[:, None], gamma_k.sqrt())[:, 0])


def _gpt2(**config):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=24, n_positions=16, n_embd=C, n_layer=1, n_head=H, attn_pdrop=0.0,
                                  resid_pdrop=0.0, embd_pdrop=0.0, **config)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    init(model.transformer.h[0].attn.c_attn, std=0.6)
    return model


@pytest.mark.hf
def test_gpt2_right_padded_clips_c_attn_by_the_real_rows():
    """GPT-2 through its AttentionInterface (sdpa): c_attn is a transposed Conv1D, q's outputs then k's; the
    pad token is the one whose rows, were they read, would push a head past tau."""
    model = _gpt2(attn_implementation="sdpa")
    attn = model.transformer.h[0].attn
    B, T = 2, 10
    ids = torch.randint(1, 24, (B, T), generator=torch.Generator().manual_seed(2))
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 6:] = False
    inputs = {}
    hook = attn.register_forward_pre_hook(lambda m, a, kw: inputs.update(h=(a[0] if a else kw["hidden_states"])),
                                          with_kwargs=True)

    def qk(ids):
        with torch.no_grad():
            model(input_ids=ids, attention_mask=pad.long())
        qkv = inputs["h"].double() @ attn.c_attn.weight.double() + attn.c_attn.bias.double()
        return tuple(t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1)[:2])

    real = causal(B, T) & pad[:, :, None] & pad[:, None, :]
    every_row = causal(B, T) & pad[:, None, :]
    best = None
    for token in range(24):  # the pad token whose padded rows read highest against the real ones
        q, k = qk(ids.masked_fill(~pad, token))
        s_real, s_all = by_hand(q, k, real), by_hand(q, k, every_row)
        gap = (s_all / s_real).max().item()
        if best is None or gap > best[0]:
            best = (gap, token, s_real, s_all)
    hook.remove()
    gap, token, s_real, s_all = best
    head = int((s_all / s_real).argmax())
    assert gap > 1.05
    tau = (s_real[head] + s_all[head]).item() / 2  # under it as the real rows read it, over it with the padding
    gamma_q, gamma_k = gammas(s_real, H, tau)
    w, b = attn.c_attn.weight.detach().clone(), attn.c_attn.bias.detach().clone()
    clip = QKClip(model, tau)
    try:
        assert torch.overrides._get_current_function_mode_stack()  # the functions are read too, until a step
        model.train()  # a training forward (no dropout in this config): an evaluation's would not count
        model(input_ids=ids.masked_fill(~pad, token), attention_mask=pad.long())
        factors = clip.step()
        # the calls went through the interface: the SDPA interception (a mode on every torch call) is gone
        assert not torch.overrides._get_current_function_mode_stack()
    finally:
        clip.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert list(factors) == ["transformer.h.0.attn"] and factors["transformer.h.0.attn"][head] == 1.0
    check_factors(factors["transformer.h.0.attn"], gamma_q, gamma_k)
    expected = rows_scaled(rows_scaled(w, gamma_q.sqrt(), dim=1), gamma_k.sqrt(), dim=1, start=C)
    close(attn.c_attn.weight, expected)
    close(attn.c_attn.bias, rows_scaled(rows_scaled(b[:, None], gamma_q.sqrt()), gamma_k.sqrt(), start=C)[:, 0])


@pytest.mark.hf
def test_gpt2_with_reorder_and_upcast_attn_is_refused_at_the_first_step():
    """Its eager path computes the scores with baddbmm, through no function the capture reads: one line naming
    the model, not a run clipped by nothing."""
    from attnscale.errors import ConfigError

    model = _gpt2(attn_implementation="eager", reorder_and_upcast_attn=True)
    clip = QKClip(model, 1.0)
    try:
        model(input_ids=torch.randint(0, 24, (1, 6)))
        with pytest.raises(ConfigError, match="saw no attention call of GPT2LMHeadModel") as e:
            clip.step()
        assert "\n" not in str(e.value)
    finally:
        clip.close()


class Failing(PaddedNet):
    """A forward that raises after its attention ran (a loss gone bad, an interrupted step)."""

    def forward(self, x, attention_mask):
        super().forward(x, attention_mask)
        raise RuntimeError("the step went wrong")


def test_a_forward_that_raises_leaves_no_padding_behind():
    """The failed forward's padding is dropped with it: a later forward that runs no hook of the model
    (``model.forward``), unpadded, is read over every causal entry."""
    model = init(Failing())
    B, T = 3, 8
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 5:], pad[1, 3:] = False, False
    x[~pad] *= 6.0  # the positions padded in the failed forward make the largest scores
    with torch.no_grad():
        q, k = model.qk(x)
    s_all = by_hand(q, k, causal(B, T))
    tau = tau_between(s_all)
    clip = QKClip(model, tau)
    try:
        with pytest.raises(RuntimeError, match="the step went wrong"):
            model(x, attention_mask=pad.long())
        with pytest.raises(RuntimeError, match="the step went wrong"):
            model.forward(x, attention_mask=torch.ones(B, T, dtype=torch.long))
        factors = clip.step()
    finally:
        clip.close()
    check_factors(factors[""], *gammas(s_all, H, tau))


# --- the layouts ------------------------------------------------------------------------------------------------


class Inner(nn.Module):
    """torchtitan's ``inner_attention``: the kernel alone, in a child of the module holding the projections."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TitanAttention(nn.Module):
    """torchtitan's Llama attention: wq/wk/wv/wo without biases, GQA by repeating the key heads before SDPA."""

    def __init__(self, kv_heads=2):
        super().__init__()
        self.n_heads, self.n_kv_heads = H, kv_heads
        self.wq, self.wk = nn.Linear(C, H * D, bias=False), nn.Linear(C, kv_heads * D, bias=False)
        self.wv, self.wo = nn.Linear(C, kv_heads * D, bias=False), nn.Linear(H * D, C, bias=False)
        self.inner_attention = Inner()

    def qk(self, x):
        B, T, _ = x.shape
        return (self.wq(x).view(B, T, H, D).transpose(1, 2),
                self.wk(x).view(B, T, self.n_kv_heads, D).transpose(1, 2))

    def forward(self, x):
        B, T, _ = x.shape
        q, k = self.qk(x)
        v = self.wv(x).view(B, T, self.n_kv_heads, D).transpose(1, 2)
        rep = H // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # torchtitan's repeat_kv
        return self.wo(self.inner_attention(q, k, v).transpose(1, 2).reshape(B, T, -1))


class TitanBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = TitanAttention()

    def forward(self, x):
        return x + self.attention(x)


class Titan(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): TitanBlock() for i in range(layers)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


class Timm(nn.Module):
    """timm's Attention: one fused ``qkv`` Linear (q's outputs, then k's, then v's, head by head)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def qk(self, x):
        B, T, _ = x.shape
        q, k, _ = self.qkv(x).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        return q, k

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))


class Grouped(nn.Module):
    """Grouped-query attention through SDPA's enable_gqa: 4 query heads on 2 key heads, with biases."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(C, H * D), nn.Linear(C, 2 * D), nn.Linear(C, 2 * D)

    def qk(self, x):
        B, T, _ = x.shape
        return self.q_proj(x).view(B, T, H, D).transpose(1, 2), self.k_proj(x).view(B, T, 2, D).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.shape
        q, k = self.qk(x)
        v = self.v_proj(x).view(B, T, 2, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(B, T, -1)


def _clip_once(model, x, tau):
    clip = QKClip(model, tau)
    try:
        model(x)
        return clip.step()
    finally:
        clip.close()


def test_torchtitan_layout_finds_wq_wk_above_inner_attention():
    model = init(Titan(), std=0.6)
    x = torch.randn(2, 9, C, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # each layer's input, as the model makes it
        x1 = x + model.layers["0"].attention(x)
    inputs = {"0": x, "1": x1}
    expected, taus = {}, []
    for i, attention in ((i, b.attention) for i, b in model.layers.items()):
        with torch.no_grad():
            q, k = attention.qk(inputs[i])
        expected[i] = (by_hand(q, k, causal(2, 9)), attention.wq.weight.detach().clone(),
                       attention.wk.weight.detach().clone())
    tau = tau_between(expected["0"][0])  # layer 1 is read after layer 0 is run with the weights before the clip
    factors = _clip_once(model, x, tau)
    assert list(factors) == ["layers.0.attention.inner_attention", "layers.1.attention.inner_attention"]
    for i, (s_max, wq, wk) in expected.items():
        gamma_q, gamma_k = gammas(s_max, 2, tau)
        check_factors(factors[f"layers.{i}.attention.inner_attention"], gamma_q, gamma_k)
        close(model.layers[i].attention.wq.weight, rows_scaled(wq, gamma_q.sqrt()))
        close(model.layers[i].attention.wk.weight, rows_scaled(wk, gamma_k.sqrt()))
    assert (gammas(expected["0"][0], 2, tau)[1] < 1).any()


@pytest.mark.parametrize("attn", [Timm(), Grouped()], ids=["fused qkv", "GQA 4 on 2"])
def test_fused_and_grouped_layouts(attn):
    model = init(attn, std=0.6)
    x = torch.randn(2, 7, C, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        q, k = model.qk(x)
    kv_heads = k.shape[1]
    s_max = by_hand(q, k, causal(2, 7))
    tau = tau_between(s_max)
    gamma_q, gamma_k = gammas(s_max, kv_heads, tau)
    if isinstance(attn, Timm):
        before = [(model.qkv.weight, model.qkv.weight.detach().clone()), (model.qkv.bias, model.qkv.bias.detach().clone())]
        factors = _clip_once(model, x, tau)
        w, b = (t.double()[:, None] if t.ndim == 1 else t for _, t in before)
        close(model.qkv.weight, rows_scaled(rows_scaled(w, gamma_q.sqrt()), gamma_k.sqrt(), start=C))
        close(model.qkv.bias, rows_scaled(rows_scaled(b, gamma_q.sqrt()), gamma_k.sqrt(), start=C)[:, 0])
        v_rows = slice(2 * C, 3 * C)
        assert torch.equal(model.qkv.weight[v_rows], before[0][1][v_rows])  # v is never touched
    else:
        wq, wk, bk = model.q_proj.weight.detach().clone(), model.k_proj.weight.detach().clone(), model.k_proj.bias.detach().clone()
        factors = _clip_once(model, x, tau)
        close(model.q_proj.weight, rows_scaled(wq, gamma_q.sqrt()))
        close(model.k_proj.weight, rows_scaled(wk, gamma_k.sqrt()))
        close(model.k_proj.bias, rows_scaled(bk[:, None], gamma_k.sqrt())[:, 0])
        assert (gamma_k.repeat_interleave(2) != gamma_q).any()  # a key head takes the largest of its group
    check_factors(factors[""], gamma_q, gamma_k)


@pytest.mark.hf
def test_remote_code_hf_model_calling_sdpa_itself_is_clipped():
    """A PreTrainedModel whose attention (as trust_remote_code models often do) calls SDPA itself, never the
    AttentionInterface: the clip falls back to the functions, as a probe does."""
    transformers = pytest.importorskip("transformers")

    class Remote(transformers.PreTrainedModel):
        config_class = transformers.PretrainedConfig

        def __init__(self, config):
            super().__init__(config)
            self.self_attn = Grouped()

        def forward(self, inputs_embeds):
            return self.self_attn(inputs_embeds)

    model = Remote(transformers.PretrainedConfig())
    init(model.self_attn, std=0.6, seed=5)
    x = torch.randn(2, 8, C, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        q, k = model.self_attn.qk(x)
    s_max = by_hand(q, k, causal(2, 8))
    tau = tau_between(s_max)
    gamma_q, gamma_k = gammas(s_max, 2, tau)
    wq, wk = model.self_attn.q_proj.weight.detach().clone(), model.self_attn.k_proj.weight.detach().clone()
    clip = QKClip(model, tau)
    try:
        for _ in range(2):  # the second step reads the same way, the fallback kept
            model(inputs_embeds=x)
            factors = clip.step()
            if _ == 0:
                check_factors(factors["self_attn"], gamma_q, gamma_k)
                close(model.self_attn.q_proj.weight, rows_scaled(wq, gamma_q.sqrt()))
                close(model.self_attn.k_proj.weight, rows_scaled(wk, gamma_k.sqrt()))
    finally:
        clip.close()
    assert (factors["self_attn"] <= 1 + 1e-6).all() and clip.kind == "hf"


# --- nn.MultiheadAttention --------------------------------------------------------------------------------------


class Mha(nn.Module):
    """PyTorch's own attention, causal, batch first; ``kdim``: keys and values from a memory of another width."""

    def __init__(self, kdim=None):
        super().__init__()
        self.attn = nn.MultiheadAttention(C, H, batch_first=True, kdim=kdim, vdim=kdim)

    def qk(self, x, memory):
        B, T, _ = x.shape
        a, E = self.attn, C
        if a._qkv_same_embed_dim:
            wq, wk = a.in_proj_weight[:E], a.in_proj_weight[E:2 * E]
        else:
            wq, wk = a.q_proj_weight, a.k_proj_weight
        bq, bk = a.in_proj_bias[:E], a.in_proj_bias[E:2 * E]
        q = (x.double() @ wq.double().T + bq.double()).view(B, T, H, D).transpose(1, 2)
        k = (memory.double() @ wk.double().T + bk.double()).view(B, memory.shape[1], H, D).transpose(1, 2)
        return q, k

    def forward(self, x, memory):
        mask = torch.ones(x.shape[1], memory.shape[1], dtype=torch.bool).tril().logical_not()  # True: hidden
        return self.attn(x, memory, memory, attn_mask=mask, need_weights=False)[0]


@pytest.mark.parametrize("kdim", [None, 12], ids=["in_proj_weight", "q_proj_weight/k_proj_weight"])
def test_multihead_attention_in_proj_rows(kdim):
    model = init(Mha(kdim), std=0.6, seed=6)
    x = torch.randn(2, 6, C, generator=torch.Generator().manual_seed(6))
    memory = x if kdim is None else torch.randn(2, 6, kdim, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        q, k = model.qk(x, memory)
    s_max = by_hand(q, k, causal(2, 6))
    tau = tau_between(s_max)
    gamma_q, gamma_k = gammas(s_max, H, tau)
    a = model.attn
    weights = ([a.in_proj_weight] if kdim is None else [a.q_proj_weight, a.k_proj_weight]) + [a.in_proj_bias]
    before = [w.detach().clone() for w in weights]
    clip = QKClip(model, tau)
    try:
        model(x, memory)
        factors = clip.step()
    finally:
        clip.close()
    (factor,) = factors.values()
    check_factors(factor, gamma_q, gamma_k)
    bias = rows_scaled(rows_scaled(before[-1][:, None], gamma_q.sqrt()), gamma_k.sqrt(), start=C)[:, 0]
    close(a.in_proj_bias, bias)
    if kdim is None:
        close(a.in_proj_weight, rows_scaled(rows_scaled(before[0], gamma_q.sqrt()), gamma_k.sqrt(), start=C))
    else:
        close(a.q_proj_weight, rows_scaled(before[0], gamma_q.sqrt()))
        close(a.k_proj_weight, rows_scaled(before[1], gamma_k.sqrt()))
    assert math.isfinite(float(factor.min()))


def test_transformer_encoder_layer_clips_its_self_attention():
    """``nn.TransformerEncoderLayer`` (post-norm: its self_attn reads the layer's input), training mode."""
    layer = nn.TransformerEncoderLayer(C, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
    attn = model.layers[0].self_attn
    init(attn, std=0.6, seed=8)
    x = torch.randn(2, 6, C, generator=torch.Generator().manual_seed(8))
    E = C
    with torch.no_grad():
        q, k = ((x.double() @ w.double().T + b.double()).view(2, 6, H, D).transpose(1, 2)
                for w, b in ((attn.in_proj_weight[:E], attn.in_proj_bias[:E]),
                             (attn.in_proj_weight[E:2 * E], attn.in_proj_bias[E:2 * E])))
    s_max = by_hand(q, k, torch.ones(2, 6, 6, dtype=torch.bool))  # no mask: every key
    tau = tau_between(s_max)
    gamma_q, gamma_k = gammas(s_max, H, tau)
    w = attn.in_proj_weight.detach().clone()
    clip = QKClip(model, tau)
    try:
        model(x)
        factors = clip.step()
    finally:
        clip.close()
    assert list(factors) == ["layers.0.self_attn"]
    check_factors(factors["layers.0.self_attn"], gamma_q, gamma_k)
    close(attn.in_proj_weight, rows_scaled(rows_scaled(w, gamma_q.sqrt()), gamma_k.sqrt(), start=C))


# --- which rows, found from the widths alone (qk_projections on modules built here) --------------------------

from attnscale.errors import ConfigError  # noqa: E402
from attnscale.watch.clip.projections import HeadRows, qk_projections  # noqa: E402

FQ, FK = torch.tensor([0.5, 0.25, 2.0, 4.0]), torch.tensor([3.0])  # a factor per query head, one per key head


def module(**parts):
    """An attention module holding ``parts``: nn.Modules as children, tensors as parameters, the rest as plain
    attributes (a flag where a bias would be)."""
    m = nn.Module()
    for name, part in parts.items():
        if isinstance(part, torch.Tensor):
            m.register_parameter(name, nn.Parameter(part))
        else:
            setattr(m, name, part)
    return m


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def check_scaled(rows, fq, fk, expected):
    """``rows`` scaled by ``fq`` (query heads) and ``fk`` (key heads): each (tensor, its copy before, the factor
    per output by hand) as ``expected`` lists them."""
    before = [t.detach().clone() for t, _ in expected]
    rows.q.scale_(fq.double())
    rows.k.scale_(fk.double())
    for (tensor, factor), was in zip(expected, before):
        f = factor.double()
        want = was * (f[:, None] if was.ndim == 2 else f)
        torch.testing.assert_close(tensor.detach(), want, rtol=0, atol=1e-12)


def per_output(*blocks):
    """The factor on each output: (factors per head, head width) blocks one after another; a float fills
    ``n`` outputs with it when given as (value, n)."""
    out = []
    for f, n in blocks:
        out.append(f.repeat_interleave(n) if isinstance(f, torch.Tensor) else torch.full((n,), float(f)))
    return torch.cat(out)


def test_a_pair_needs_both_projections_so_a_lone_query_beside_a_fused_qkv_is_not_one():
    m = module(query=nn.Linear(C, C, dtype=torch.float64), qkv=nn.Linear(C, C + D + D, dtype=torch.float64))
    rows = qk_projections([("attn", m)], H, D)
    check_scaled(rows, FQ, FK, [(m.qkv.weight, per_output((FQ, D), (FK, D), (1, D))),
                                (m.qkv.bias, per_output((FQ, D), (FK, D), (1, D))),
                                (m.query.weight, per_output((1, C)))])


@pytest.mark.parametrize("q_out,k_out", [(3 * D, 2 * D), (H * D, 2 * D + 1), (H * D, 3 * D), (H * D, 0)],
                         ids=["q 3 heads wide", "k not whole heads", "4 query heads on 3 key heads", "no key head"])
def test_separate_projections_of_other_widths_are_refused_by_name(q_out, k_out):
    m = module(q_proj=Packed(torch.zeros(q_out, C)), k_proj=Packed(torch.zeros(k_out, C)))
    with pytest.raises(ConfigError) as e:
        qk_projections([("layers.3.attn", m)], H, D)
    assert str(e.value) == ("QK-Clip cannot find the rows of 4 heads of width 4 in layers.3.attn: its projections "
                            "have other widths than the call's q and k; leave qk_clip off for this model")


@pytest.mark.parametrize("out", [H * D + 3 * D, H * D - 2 * D, H * D, H * D + 2 * D + 1],
                         ids=["3 more heads (odd)", "fewer than q's", "q's alone", "2 heads and an output more"])
def test_fused_projections_of_other_widths_are_refused(out):
    m = module(qkv=nn.Linear(C, out))
    with pytest.raises(ConfigError, match="cannot find the rows of 4 heads of width 4 in blk: its projections"):
        qk_projections([("blk", m)], H, D)


def test_a_fused_projection_with_one_key_head_for_four_query_heads():
    """Multi-query attention, fused: q's 4 heads, then one key head, then one value head."""
    m = module(c_attn=nn.Linear(C, H * D + 2 * D, dtype=torch.float64))
    rows = qk_projections([("attn", m)], H, D)
    check_scaled(rows, FQ, FK, [(m.c_attn.weight, per_output((FQ, D), (FK, D), (1, D)))])


class Packed(nn.Module):
    """A projection that is no nn.Linear: ``weight`` as given (None, or a tensor of any shape), and maybe no
    ``bias`` at all, or a ``bias`` that is a flag."""

    def __init__(self, weight, **bias):
        super().__init__()
        self.weight = weight
        self.__dict__.update(bias)


def test_a_projection_without_a_two_d_weight_is_refused_naming_its_class():
    for weight in (None, torch.zeros(3 * C)):
        for m in (module(qkv=Packed(weight)), module(q_proj=Packed(weight), k_proj=nn.Linear(C, C))):
            with pytest.raises(ConfigError) as e:
                qk_projections([("attn", m)], H, D)
            assert str(e.value) == "Packed has no 2-D weight for QK-Clip to scale"
    bare = nn.Module()  # no weight attribute at all
    with pytest.raises(ConfigError, match="^Module has no 2-D weight for QK-Clip to scale$"):
        qk_projections([("attn", module(qkv=bare))], H, D)


@pytest.mark.parametrize("bias", [{}, {"bias": True}], ids=["no bias attribute", "bias a flag"])
def test_a_weight_without_a_bias_tensor_scales_the_weight_alone(bias):
    m = module(qkv=Packed(randn(3 * C, C), **bias))
    rows = qk_projections([("attn", m)], H, D)
    check_scaled(rows, FQ, torch.tensor([1.0, 2.0, 3.0, 5.0]),
                 [(m.qkv.weight, per_output((FQ, D), (torch.tensor([1.0, 2.0, 3.0, 5.0]), D), (1, C)))])


# nn.MultiheadAttention's names on modules of one's own: E = H * D = C


@pytest.mark.parametrize("extra", [{}, {"in_proj_bias": False}], ids=["no bias, no bias_k", "in_proj_bias a flag"])
def test_in_proj_weight_alone_is_q_then_k_then_v(extra):
    m = module(in_proj_weight=randn(3 * C, C), **extra)
    rows = qk_projections([("attn", m)], H, D)
    fk = torch.tensor([1.0, 2.0, 3.0, 5.0])
    check_scaled(rows, FQ, fk, [(m.in_proj_weight, per_output((FQ, D), (fk, D), (1, C)))])


def test_q_proj_weight_and_k_proj_weight_without_in_proj_weight():
    """Each weight's own rows; ``q_proj_weight`` may read inputs of another width (12) than E."""
    m = module(q_proj_weight=randn(C, 12), k_proj_weight=randn(C, 12, seed=1), in_proj_bias=randn(3 * C, seed=2))
    rows = qk_projections([("attn", m)], H, D)
    fk = torch.tensor([1.0, 2.0, 3.0, 5.0])
    check_scaled(rows, FQ, fk, [(m.q_proj_weight, per_output((FQ, D))), (m.k_proj_weight, per_output((fk, D))),
                                (m.in_proj_bias, per_output((FQ, D), (fk, D), (1, C)))])


@pytest.mark.parametrize("parts", [
    {"in_proj_weight": torch.zeros(2 * C, C)},
    {"q_proj_weight": torch.zeros(C, C)},
    {"q_proj_weight": torch.zeros(C, C), "k_proj_weight": torch.zeros(2 * C, C)},
    {"q_proj_weight": torch.zeros(2 * C, C), "k_proj_weight": torch.zeros(C, C)},
], ids=["in_proj_weight 2E rows", "no k_proj_weight", "k_proj_weight 2E rows", "q_proj_weight 2E rows"])
def test_multihead_weights_of_other_widths_are_refused(parts):
    with pytest.raises(ConfigError, match="^QK-Clip cannot find the rows of 4 heads of width 4 in mha: its "):
        qk_projections([("mha", module(**parts))], H, D)


def test_multihead_attention_with_add_bias_kv_is_refused_naming_it():
    mha = nn.MultiheadAttention(C, H, add_bias_kv=True)
    with pytest.raises(ConfigError) as e:
        qk_projections([("encoder.attn", mha)], H, D)
    assert str(e.value) == ("encoder.attn has add_bias_kv: its learned key bias_k is no row of W_k, so QK-Clip "
                            "cannot scale every score of a head; leave qk_clip off for it")


def test_a_chain_with_no_known_projection_is_refused_naming_its_first_module():
    chain = [("blocks.0.inner", nn.Identity()), ("blocks.0", nn.Module())]
    with pytest.raises(ConfigError) as e:
        qk_projections(chain, H, D)
    assert str(e.value) == (
        "QK-Clip cannot find the rows of 4 heads of width 4 in blocks.0.inner nor any module above it: it looks for "
        "q_proj/k_proj, query/key, wq/wk, q/k, a fused c_attn, qkv, qkv_proj, Wqkv projection (q's outputs, then "
        "k's, then v's) or nn.MultiheadAttention's in_proj_weight; leave qk_clip off for this model")


def test_a_norm_of_q_or_k_is_refused_in_so_many_words():
    m = module(q_proj=nn.Linear(C, C), k_proj=nn.Linear(C, C), k_norm=nn.LayerNorm(D))
    with pytest.raises(ConfigError) as e:
        qk_projections([("layers.1.self_attn", m)], H, D)
    assert str(e.value) == ("layers.1.self_attn normalises q or k after the projection (k_norm), which undoes any "
                            "scaling of W_q and W_k: QK-Clip cannot act there; leave qk_clip off for this model")


def test_attnscale_qk_norm_scale_is_refused_in_so_many_words():
    from attnscale.lm.model import ModelConfig, build_model

    model = build_model(ModelConfig(vocab_size=40, context=8, d_model=16, n_layers=1, n_heads=2, scale="qk_norm"),
                        seed=0)
    attn = model.blocks[0].attn
    with pytest.raises(ConfigError) as e:
        qk_projections([("blocks.0.attn", attn)], 2, 8)
    assert str(e.value) == (f"blocks.0.attn uses the score scale {type(attn.scale).__name__}, which prepares q and k "
                            "itself (qk-norm) and undoes any scaling of W_q and W_k: leave qk_clip off for it")
    assert type(attn.scale).__name__ != "NoneType"


def test_scaling_rows_in_float64_keeps_a_float64_factor_whole():
    """A float64 weight times a float64 factor of 1/3 is exact to float64, not rounded through float32."""
    w, b = randn(3 * C, C), randn(3 * C)
    rows = HeadRows(w, b, 0, C, H, D)
    factor = torch.full((H,), 1 / 3, dtype=torch.float64)
    expected_w, expected_b = w.clone(), b.clone()
    expected_w[C:2 * C] *= 1 / 3
    expected_b[C:2 * C] *= 1 / 3
    rows.scale_(factor)
    assert torch.equal(w, expected_w) and torch.equal(b, expected_b)


# --- FSDP2's DTensors, on a one-process gloo group ---------------------------------------------------------------


@pytest.fixture
def mesh(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of its own")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("hsdp", [False, True], ids=["FSDP", "HSDP: replicated, then sharded"])
@pytest.mark.parametrize("dim,shard", [(0, 0), (0, 1), (1, 1), (1, 0)],
                         ids=["outputs on dim 0, sharded there", "outputs on dim 0, sharded on 1",
                              "Conv1D: outputs on dim 1, sharded there", "Conv1D, sharded on 0"])
def test_sharded_weights_are_scaled_as_whole_ones(mesh, dim, shard, hsdp):
    """A DTensor weight (and bias) scaled shard by shard equals the whole weight scaled by hand."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if hsdp:
        mesh = init_device_mesh("cpu", (1, 1))
    before = [Replicate()] if hsdp else []
    w = randn(3 * C, C) if dim == 0 else randn(C, 3 * C)
    b = randn(3 * C, seed=1)
    dw, db = distribute_tensor(w, mesh, before + [Shard(shard)]), distribute_tensor(b, mesh, before + [Shard(0)])
    rows = HeadRows(dw, db, dim, C, H, D)
    rows.scale_(FQ.double())
    f = per_output((1, C), (FQ, D), (1, C))
    assert type(dw).__name__ == "DTensor" and dw.placements == tuple(before + [Shard(shard)])
    torch.testing.assert_close(dw.full_tensor(), w * (f[:, None] if dim == 0 else f[None, :]), rtol=0, atol=1e-12)
    torch.testing.assert_close(db.full_tensor(), b * f, rtol=0, atol=1e-12)




def _tensor_parallel_worker(rank: int, out: str, layouts=((None, False), ({"": [0]}, True))) -> None:
    """Each of two ranks holds 4 heads of its own (TensorParallel's default: rank t holds global heads 4t..4t+3)
    and sees its own batch: its heads are clipped by its own S_max, by hand, never maxed with the other rank's;
    then a ``heads`` layout of one index for 4 local heads is refused, naming the layer."""
    from attnscale.errors import ConfigError
    from attnscale.watch import TensorParallel

    x = torch.randn(2, 5, C, generator=torch.Generator().manual_seed(10 + rank)) * (1 + 3 * rank)
    for heads, refused in layouts:
        model = init(Grouped())
        with torch.no_grad():
            q, k = model.qk(x)
        s_max = by_hand(q, k, causal(2, 5))
        tau = tau_between(s_max)
        clip = QKClip(model, tau, tensor_parallel=TensorParallel(heads=heads))
        try:
            model(x)
            if refused:
                try:
                    clip.step()
                except ConfigError as e:
                    assert str(e) == ("TensorParallel.heads gives 1 heads for '', where this rank holds 4; give one "
                                      "global index per local head"), str(e)
                else:
                    raise AssertionError("one index for 4 heads was not refused")
            else:
                check_factors(clip.step()[""], *gammas(s_max, 2, tau))
        finally:
            clip.close()


def test_tensor_parallel_ranks_clip_their_own_heads_as_one_process_does_and_refuse_heads_that_do_not_fit(
        tmp_path_factory):
    """One process first (no group: TensorParallel lays its heads out as rank 0 of one, and a layout is read only
    across ranks), then each of two ranks.
    The first part also runs the clip in this process: mutmut links a test to the functions it calls in its own
    process only, so without it the two ranks' test would never judge the clip's mutants."""
    from gloo import spawned_into

    _tensor_parallel_worker(0, "", layouts=((None, False),))
    spawned_into(tmp_path_factory, "tensor_parallel", _tensor_parallel_worker)
