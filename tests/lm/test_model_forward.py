"""lm.model's forward and loss against a float64 re-implementation written here from the same weights:
token and position embeddings, pre- or post-LN blocks, causal attention at each score scale, the 4× GELU
MLP, the final LayerNorm, a tied or untied read-out; the loss is the mean next-token cross-entropy.

Every weight, LayerNorm gains and biases included, is drawn at random first: at their initial 1 and 0 two
LayerNorms are the same function, and a forward that read the wrong one would pass."""

import math

import pytest
import torch

from attnscale.lm.model import ModelConfig, TinyLM, build_model

V, C, DM, L, NH, HD = 13, 7, 12, 2, 3, 5


def _model(**kw) -> TinyLM:
    cfg = ModelConfig(**{**dict(vocab_size=V, context=C, d_model=DM, n_layers=L, n_heads=NH, head_dim=HD), **kw})
    model = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("log_factor"):
                p.fill_(math.log(0.37))  # a learned factor other than 1/sqrt(d)
            elif name.endswith(("q_gain", "k_gain")) or (p.dim() == 1 and "ln" in name and name.endswith("weight")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
    return model


def _ln(x, w, b):
    m = x.mean(-1, keepdim=True)
    var = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(var + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1 + torch.special.erf(x / math.sqrt(2)))


def _rms(x, gain):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * gain


def _attention(w, pre, x, scale):
    B, T, _ = x.shape
    q, k, v = (x @ w[f"{pre}.{n}_proj.weight"].T for n in "qkv")
    q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
    factor = {"none": 1.0, "inv_sqrt_d": HD**-0.5, "inv_d": 1 / HD, "qk_norm": HD**-0.5, "softcap": HD**-0.5,
              "learned_temp": 0.37}[scale]
    if scale == "qk_norm":
        q, k = _rms(q, w[f"{pre}.scale.q_gain"]), _rms(k, w[f"{pre}.scale.k_gain"])
    s = (q @ k.transpose(-2, -1)) * factor
    if scale == "softcap":
        s = 50.0 * torch.tanh(s / 50.0)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    z = torch.softmax(s, -1) @ v
    return z.transpose(1, 2).reshape(B, T, NH * HD) @ w[f"{pre}.o_proj.weight"].T


def _forward64(model: TinyLM, idx):
    cfg = model.cfg
    w = {n: p.detach().double() for n, p in model.named_parameters()}
    x = w["tok_emb.weight"][idx] + w["pos_emb.weight"][: idx.shape[1]]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        ln1 = lambda t: _ln(t, w[f"{b}.ln1.weight"], w[f"{b}.ln1.bias"])  # noqa: E731
        ln2 = lambda t: _ln(t, w[f"{b}.ln2.weight"], w[f"{b}.ln2.bias"])  # noqa: E731
        mlp = lambda t: _gelu(t @ w[f"{b}.mlp.up.weight"].T + w[f"{b}.mlp.up.bias"]) @ w[f"{b}.mlp.down.weight"].T \
            + w[f"{b}.mlp.down.bias"]  # noqa: E731
        if cfg.norm == "pre":
            x = x + _attention(w, f"{b}.attn", ln1(x), cfg.scale)
            x = x + mlp(ln2(x))
        else:
            x = ln1(x + _attention(w, f"{b}.attn", x, cfg.scale))
            x = ln2(x + mlp(x))
    if cfg.norm == "pre":
        x = _ln(x, w["ln_f.weight"], w["ln_f.bias"])
    head = w["tok_emb.weight"] if cfg.tie_embeddings else w["head.weight"]
    return x @ head.T


IDX = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("scale", ["none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_the_forward_is_the_model_written_out_in_float64(scale, norm, impl):
    model = _model(scale=scale, norm=norm, impl=impl)
    want = _forward64(model, IDX)
    torch.testing.assert_close(model(IDX).double(), want, rtol=1e-4, atol=1e-4)
    shorter = IDX[:, :4]  # fewer tokens than the context: positions from 0
    torch.testing.assert_close(model(shorter).double(), _forward64(model, shorter), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_the_read_out_is_the_token_embedding_where_tied_and_its_own_matrix_where_not(tied):
    model = _model(tie_embeddings=tied)
    assert (model.head.weight is model.tok_emb.weight) == tied
    torch.testing.assert_close(model(IDX).double(), _forward64(model, IDX), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_loss_is_the_mean_next_token_cross_entropy_in_nats(norm):
    model = _model(norm=norm)
    targets = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(3))
    logits = _forward64(model, IDX)
    nll = [float(torch.logsumexp(logits[b, t], 0) - logits[b, t, targets[b, t]]) for b in range(2) for t in range(C)]
    assert float(model.loss(IDX, targets)) == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert model.loss(IDX, targets).dtype == torch.float32


def test_the_parameter_count_is_the_layers_written_out():
    for tied in (False, True):
        model = TinyLM(ModelConfig(vocab_size=V, context=C, d_model=DM, n_layers=L, n_heads=NH, head_dim=HD,
                                   tie_embeddings=tied))
        inner = NH * HD
        block = 2 * 2 * DM + 4 * DM * inner + (DM * 4 * DM + 4 * DM) + (4 * DM * DM + DM)
        want = V * DM + C * DM + L * block + 2 * DM + (0 if tied else V * DM)
        assert model.num_params() == want
        assert model.cfg.d_attn == inner


def _std(t: torch.Tensor) -> float:
    return float(t.double().std())


def test_the_gpt2_and_unit_inits_draw_each_weight_at_its_named_deviation():
    """gpt2: N(0, 0.02) matrices, residual projections N(0, 0.02/sqrt(2·n_layers)), biases 0, gains 1;
    unit: gpt2 but q and k projections N(0, 1/sqrt(d_model))."""
    kw = dict(vocab_size=300, context=64, d_model=96, n_layers=3, n_heads=4, head_dim=32)
    for init in ("gpt2", "unit"):
        model = build_model(ModelConfig(**kw, init=init), seed=0)
        for name, p in model.named_parameters():
            if p.dim() < 2:
                assert torch.equal(p, torch.zeros_like(p) if name.endswith("bias") else torch.ones_like(p)), name
                continue
            want = 0.02
            if name.endswith(("attn.o_proj.weight", "mlp.down.weight")):
                want = 0.02 / math.sqrt(2 * 3)
            if init == "unit" and name.endswith(("attn.q_proj.weight", "attn.k_proj.weight")):
                want = 1 / math.sqrt(96)
            assert _std(p) == pytest.approx(want, rel=0.1), (init, name)
            assert abs(float(p.double().mean())) < 4 * want / math.sqrt(p.numel()) + 1e-12, (init, name)
