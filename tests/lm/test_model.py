import math

import pytest
import torch

from attnscale.core.diagnostics import spread
from attnscale.errors import ConfigError
from attnscale.core.hooks import hook_names, hooked
from attnscale.lm.model import ModelConfig, TinyLM, build_model


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=11, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4)
    return ModelConfig(**{**base, **kw})


def _emb_grad(model: TinyLM, idx_BT: torch.Tensor, t: int) -> torch.Tensor:
    """Gradient of the logits at position t with respect to the input embeddings, per position."""
    held = {}

    def keep(module, inputs, out):
        out.retain_grad()
        held["x"] = out

    handle = model.tok_emb.register_forward_hook(keep)
    try:
        model(idx_BT)[:, t].sum().backward()
    finally:
        handle.remove()
    return held["x"].grad.abs().sum((0, 2))


@pytest.mark.parametrize("impl", ["fused", "explicit"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causal_through_gradients(impl, norm):
    torch.manual_seed(0)
    model = TinyLM(tiny(impl=impl, norm=norm))
    idx_BT = torch.randint(0, 11, (2, 8))
    t = 4
    grad_T = _emb_grad(model, idx_BT, t)
    assert torch.all(grad_T[t + 1 :] == 0), "a future token leaked into position t"
    assert torch.all(grad_T[: t + 1] > 0), "position t should see itself and the past"


@pytest.mark.parametrize("scale", ["none", "inv_sqrt_d", "qk_norm"])
def test_explicit_and_fused_give_same_logits_and_grads(scale):
    outs = []
    for impl in ("fused", "explicit"):
        model = build_model(tiny(impl=impl, scale=scale), seed=3)
        idx_BT = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
        logits = model(idx_BT)
        logits.square().mean().backward()
        outs.append((logits.detach(), model.blocks[0].attn.q_proj.weight.grad.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-6)


def test_hook_names_are_pinned():
    names = hook_names(TinyLM(tiny(n_layers=2)))
    per_layer = ["hook_q", "hook_k", "hook_scores", "hook_pattern", "hook_z"]
    assert names == [f"blocks.{i}.attn.{h}" for i in range(2) for h in per_layer]


def test_recording_shapes_and_cleanup():
    model = TinyLM(tiny(n_heads=3, head_dim=5))
    with hooked(model, ["*hook_scores", "*hook_pattern"]) as cache:
        model(torch.randint(0, 11, (2, 6)))
    assert cache["blocks.1.attn.hook_scores"].shape == (2, 3, 6, 6)
    assert cache["blocks.0.attn.hook_pattern"].sum(-1).allclose(torch.ones(2, 3, 6))
    assert not any(b.attn.recording for b in model.blocks)


def test_head_dim_is_set_apart_from_d_model():
    cfg = tiny(d_model=16, n_heads=2, head_dim=64)
    assert cfg.head_dim == 64 and cfg.d_attn == 128
    assert TinyLM(cfg).blocks[0].attn.q_proj.weight.shape == (128, 16)
    assert ModelConfig(vocab_size=5, d_model=32, n_heads=4).head_dim == 8  # coupled mode


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"d_model": 0}, "d_model"),
        ({"head_dim": 0}, "head_dim"),
        ({"n_layers": 0}, "n_layers"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"scale": "sqrt"}, "inv_sqrt_d"),
        ({"init": "xavier"}, "gpt2"),
        ({"impl": "flash"}, "explicit"),
        ({"head_dim": None, "d_model": 10, "n_heads": 3}, "divisible"),
    ],
)
def test_bad_config_raises_one_helpful_line(kw, words):
    with pytest.raises(ConfigError, match=words) as err:
        tiny(**kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kw, line",
    [
        ({"n_heads": 0}, "model n_heads must be a positive integer, got 0"),
        ({"head_dim": 0}, "model head_dim must be a positive integer or None (= d_model // n_heads), got 0"),
        ({"head_dim": None, "d_model": 10, "n_heads": 3},
         "model d_model=10 is not divisible by n_heads=3; change one, or set head_dim to decouple the head width"),
        ({"scale": "sqrt"}, "model scale 'sqrt' is unknown; choose one of: none, inv_sqrt_d, inv_d, qk_norm, softcap, "
                            "learned_temp, uniform"),
        ({"init": "xavier"}, "model init 'xavier' is unknown; choose one of: torch, gpt2, unit"),
        ({"norm": "mid"}, "model norm 'mid' is unknown; choose one of: pre, post"),
    ],
)
def test_each_refusal_is_the_line_a_user_reads(kw, line):
    with pytest.raises(ConfigError) as err:
        tiny(**kw)
    assert str(err.value) == line


def test_a_head_one_wide_is_a_head():
    model = TinyLM(tiny(head_dim=1))
    assert model.blocks[0].attn.q_proj.weight.shape == (model.cfg.n_heads, model.cfg.d_model)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, model.cfg.vocab_size)


def test_too_long_sequence_raises():
    with pytest.raises(ConfigError, match="context"):
        TinyLM(tiny())(torch.zeros(1, 9, dtype=torch.long))


def test_build_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a = build_model(tiny(), seed=1)
    after = torch.rand(1)
    b = build_model(tiny(), seed=1)
    assert torch.equal(before, after)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    # without a seed it draws from the caller's generator, as TinyLM itself does
    torch.manual_seed(7)
    c = build_model(tiny())
    torch.manual_seed(7)
    assert c.cfg == tiny() and all(torch.equal(p, q) for p, q in zip(c.parameters(), TinyLM(tiny()).parameters()))


def test_tied_embeddings_share_one_tensor():
    model = TinyLM(tiny(tie_embeddings=True))
    assert model.head.weight is model.tok_emb.weight
    assert TinyLM(tiny()).head.weight is not TinyLM(tiny()).tok_emb.weight


def _first_spread(cfg: ModelConfig, seed=0) -> float:
    model = build_model(cfg, seed=seed)
    with hooked(model, "blocks.0.attn.hook_scores") as cache:
        model(torch.randint(0, cfg.vocab_size, (8, cfg.context), generator=torch.Generator().manual_seed(0)))
    return float(spread(cache["blocks.0.attn.hook_scores"]))


def test_named_inits_set_the_step0_spread():
    """Spread of raw q·k at layer 0 = sqrt(d)·var(q entry), with var(q) = var(x)·d_model·var(w):
    unit -> 1 per entry; torch (kaiming-uniform, var(w) = 1/(3·fan_in)) -> 1/3 behind a
    LayerNorm, 2/3 on raw N(0,1)+N(0,1) embeddings (post-LN); gpt2 -> d_model·0.02²."""
    d = 64
    kw = dict(vocab_size=50, context=16, d_model=64, n_layers=1, n_heads=2, head_dim=d, scale="none")
    assert _first_spread(ModelConfig(**kw, init="unit")) == pytest.approx(math.sqrt(d), rel=0.25)
    assert _first_spread(ModelConfig(**kw, init="torch")) == pytest.approx(math.sqrt(d) / 3, rel=0.25)
    assert _first_spread(ModelConfig(**kw, init="torch", norm="post")) == pytest.approx(math.sqrt(d) * 2 / 3, rel=0.25)
    assert _first_spread(ModelConfig(**kw, init="gpt2")) == pytest.approx(math.sqrt(d) * 64 * 0.02**2, rel=0.25)
