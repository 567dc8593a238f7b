"""attnscale.watch's captures read the q and k a model really uses.

Each capture is checked against the model's own reference weights: transformers'
eager attention (``output_attentions=True``) for Hugging Face models, the manual
path of a nanoGPT-shaped model for the SDPA interception. The numbers must agree
per head to 1e-5 relative, and nothing may stay installed after a probe."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnscale import watch
from reference import head_measures
from attnscale.errors import ConfigError
from attnscale.capture.sdpa import capture_sdpa

RTOL, ATOL = 1e-5, 1e-7


def reference(scores_BHTS, weights_BHTS, visible, real_BT=None):
    """``head_measures`` on a model's own scores and weights: masked entries -inf,
    padding rows (``real_BT`` False) left out as the watch leaves them out."""
    visible = visible.expand_as(scores_BHTS)
    if real_BT is not None:
        visible = visible & real_BT[:, None, :, None]
    return head_measures(scores_BHTS.float().masked_fill(~visible, float("-inf")), weights_BHTS.float().masked_fill(~visible, 0.0))


def no_function_mode() -> bool:
    return not torch.overrides._get_current_function_mode_stack()


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ---- Hugging Face models, through their own attention function ------------------------


transformers = pytest.importorskip("transformers")


class Softmaxes(TorchFunctionMode):
    """The inputs of every softmax: transformers' eager attention takes its scores
    (scaled, masked with the dtype's lowest value) through one."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.softmax:
            self.inputs.append(args[0].detach())
        return func(*args, **(kwargs or {}))


def eager_reference(model, batch):
    """Per layer, the measures from the model's eager scores and weights."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad(), Softmaxes() as grab:
            out = model(**batch, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    real = batch["attention_mask"].bool()
    refs = []
    for scores, weights in zip(grab.inputs, out.attentions):
        visible = scores > torch.finfo(scores.dtype).min / 2
        refs.append(reference(scores, weights, visible, real))
    return torch.stack(refs)


def bert():
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=64, attn_implementation="sdpa")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def llama(**kw):
    cfg = transformers.LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   **{"attn_implementation": "sdpa", **kw})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaModel(cfg).eval()


def padded_batch(B=3, T=14, vocab=120):
    ids = torch.randint(1, vocab, (B, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 10:] = 0
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def hf_state(model):
    """What a capture may touch: every config's implementation, the interface's entries, the eager functions."""
    from attnscale.capture.hf import _configs, _modeling_files

    interface = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS
    return ([c._attn_implementation for c in _configs(model)], {k: interface[k] for k in interface},
            [getattr(m, "eager_attention_forward", None) for m in _modeling_files(model)])


@pytest.mark.parametrize("build", [bert, llama], ids=["bert", "llama-gqa"])
def test_hf_sdpa_equals_eager_weights_per_head(build):
    model = build()
    batch = padded_batch()
    before = hf_state(model)
    stats = watch.measure_heads(model, batch)
    assert hf_state(model) == before and model.config._attn_implementation == "sdpa"
    ref = eager_reference(model, batch)
    assert stats.values_LMH.shape == ref.shape
    torch.testing.assert_close(stats.values_LMH, ref, rtol=RTOL, atol=ATOL)
    # padding rows never count: the real rows (14 + 10 + 4), less the first of each under a causal mask
    assert stats.rows_LH.unique().tolist() == [28.0 if build is bert else 25.0]


def test_hf_gqa_reads_k_before_repeat_kv():
    calls = []
    model = llama()
    with watch.capture_hf(model, calls.append), torch.no_grad():
        model(**padded_batch())
    assert len(calls) == 3 and all((c.heads, c.kv_heads) == (4, 2) for c in calls)
    assert calls[0].scale == pytest.approx(16**-0.5) and calls[0].name == "layers.0.self_attn"


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_keeps_its_own_implementation_and_outputs(impl):
    model = llama(attn_implementation=impl)
    batch = padded_batch()
    with torch.no_grad():
        want = model(**batch).last_hidden_state
    seen = []
    with watch.capture_hf(model, seen.append), torch.no_grad():
        got = model(**batch).last_hidden_state
    assert torch.equal(got, want) and len(seen) == 3
    assert model.config._attn_implementation == impl
    if impl == "eager":  # eager's additive float mask is read as a mask, no bias: its fills hide, its zeros add nothing
        assert seen[0].bias is None and seen[0].mask.is_floating_point() and not seen[0].has_bias()
        assert seen[0].bias_rows() is None
        causal = torch.ones(seen[0].q.shape[-2], seen[0].k.shape[-2], dtype=torch.bool).tril()
        assert torch.equal(seen[0].visible()[:, 0] & causal, seen[0].visible()[:, 0])


def test_hf_eager_model_measures_as_the_sdpa_one():
    batch = padded_batch()
    a = watch.measure_heads(llama(attn_implementation="eager"), batch)
    b = watch.measure_heads(llama(), batch)
    torch.testing.assert_close(a.values_LMH, b.values_LMH, rtol=RTOL, atol=ATOL)


def test_hf_is_restored_after_an_error_inside_the_probe(monkeypatch):
    model = llama()
    before = hf_state(model)

    class Boom(RuntimeError):
        pass

    def explode(*args, **kwargs):
        raise Boom

    with monkeypatch.context() as m:  # the second layer fails, after the first was captured
        m.setattr(model.layers[1].mlp, "forward", explode)
        with pytest.raises(Boom):
            watch.measure_heads(model, padded_batch())
    assert hf_state(model) == before and model.config._attn_implementation == "sdpa"
    assert not model.training
    with pytest.raises(Boom):  # an error in the capture itself
        with watch.capture_hf(model, explode), torch.no_grad():
            model(**padded_batch())
    assert hf_state(model) == before
    assert watch.measure(model, padded_batch())["attn/max_score"] > 0  # and the next probe works as before


def test_hf_other_models_pass_through_while_one_is_probed():
    probed, other = llama(), llama()
    seen = []
    with watch.capture_hf(probed, seen.append), torch.no_grad():
        other(**padded_batch())
    assert seen == []


# ---- SDPA interception: a nanoGPT-shaped model, not from Hugging Face ---------------------


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention (model.py), with optional GQA and an optional mask; ``flash``
    chooses F.scaled_dot_product_attention or the manual path, which keeps its scores
    and weights for the reference."""

    def __init__(self, d=32, heads=4, kv_heads=4, T=16, flash=True, mask=None):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd)
        self.proj = nn.Linear(d, d)
        self.flash, self.mask = flash, mask
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.kept = None

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        gqa = self.kv_heads != self.heads
        if self.flash:
            kw = dict(attn_mask=self.mask) if self.mask is not None else dict(is_causal=True)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, enable_gqa=gqa, **kw)
        else:
            if gqa:
                k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
            score = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = score
            if self.mask is None:
                visible = self.bias[:, :, :T, :T] != 0
            elif self.mask.dtype == torch.bool:
                visible = self.mask
            else:  # an additive mask: its finite part is a bias, in the weights and never in the scores
                att, visible = score + self.mask, torch.isfinite(self.mask)
            att = att.masked_fill(~visible, float("-inf"))
            p = F.softmax(att, dim=-1)
            self.kept = (score, p, visible)
            y = p @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class TinyGPT(nn.Module):
    def __init__(self, layers=2, **kw):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.blocks = nn.ModuleList([CausalSelfAttention(**kw) for _ in range(layers)])

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = x + b(x)
        return x


def gpt(**kw):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return TinyGPT(**kw).eval()


def manual_reference(model, ids):
    for b in model.blocks:
        b.flash = False
    with torch.no_grad():
        model(ids)
    refs = [reference(*b.kept) for b in model.blocks]
    for b in model.blocks:
        b.flash = True
    return torch.stack(refs)


IDS = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))


def _bool_mask():
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(3, 1, 16, 16, generator=g) > 0.4
    mask[..., 0] = True  # every row sees a key
    return mask


def _alibi_mask():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])[None, :, None, None]
    dist = (torch.arange(16)[None, :] - torch.arange(16)[:, None]).float()
    return (slopes * dist).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("kw", [{}, {"kv_heads": 2}, {"mask": "bool"}, {"mask": "float"}],
                         ids=["is_causal", "enable_gqa", "bool-mask", "additive-float-mask"])
def test_sdpa_interception_equals_the_manual_path(kw):
    kw = dict(kw)
    if kw.get("mask") == "bool":
        kw["mask"] = _bool_mask()
    elif kw.get("mask") == "float":
        kw["mask"] = _alibi_mask()
    model = gpt(**kw)
    stats = watch.measure_heads(model, IDS)
    assert no_function_mode()
    torch.testing.assert_close(stats.values_LMH, manual_reference(model, IDS), rtol=RTOL, atol=ATOL)


def test_sdpa_reads_the_arguments_as_passed():
    calls = []
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    with capture_sdpa(None, calls.append):
        F.scaled_dot_product_attention(q, k, k, scale=0.3, enable_gqa=True)
        torch.nn.functional.scaled_dot_product_attention(q[0], q[0], q[0], is_causal=True)  # no batch dim
    assert no_function_mode()
    first, second = calls
    assert first.scale == 0.3 and (first.heads, first.kv_heads) == (4, 2) and not first.is_causal
    assert second.q.shape == (1, 4, 5, 8) and second.is_causal and second.scale is None
    assert second.factor == pytest.approx(8**-0.5)


def test_sdpa_mode_is_popped_after_an_error():
    def explode(call):
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        with capture_sdpa(None, explode):
            F.scaled_dot_product_attention(*[torch.randn(1, 1, 3, 4)] * 3)
    assert no_function_mode()


# ---- the adapter, and nothing left behind ---------------------------------------------------


def read(module, args, kwargs, output):
    """An adapter for CausalSelfAttention: recompute q and k from the block's input."""
    x = args[0]
    B, T, _ = x.shape
    q = module.q(x).view(B, T, module.heads, module.hd).transpose(1, 2)
    k = module.kv(x).view(B, T, 2, module.kv_heads, module.hd).permute(2, 0, 3, 1, 4)[0]
    return q, k, module.bias[:, :, :T, :T] != 0, None


def test_adapter_equals_the_manual_path_and_removes_its_hooks():
    model = gpt(kv_heads=2)
    stats = watch.measure_heads(model, IDS, adapter=watch.Adapter("blocks.?", read))
    assert no_hooks(model) and no_function_mode()
    assert stats.layer_names == ("blocks.0", "blocks.1")
    torch.testing.assert_close(stats.values_LMH, manual_reference(model, IDS), rtol=RTOL, atol=ATOL)
    with pytest.raises(ConfigError, match="names no module"):
        watch.measure_heads(model, IDS, adapter=watch.Adapter("nothing.*", read))


def test_nothing_stays_installed_after_any_probe():
    from attnscale.lm.model import ModelConfig, build_model

    tiny = build_model(ModelConfig(vocab_size=50, context=16, d_model=32, n_layers=2, n_heads=4, head_dim=8), seed=0)
    hf = llama()
    before = hf_state(hf)
    for model, batch, kw in [(tiny, IDS, {}), (gpt(), IDS, {}), (gpt(), IDS, {"adapter": watch.Adapter("blocks.?", read)}),
                             (hf, padded_batch(), {}), (hf, padded_batch(), {"capture": "sdpa"})]:
        watch.measure(model, batch, **kw)
        assert no_hooks(model) and no_function_mode()
    assert hf_state(hf) == before


def test_hf_model_whose_attention_skips_the_interface_falls_back_to_sdpa():
    """A PreTrainedModel with its own attention (calling SDPA directly): "auto" reads the SDPA calls."""

    class Own(transformers.PreTrainedModel):
        config_class = transformers.PretrainedConfig

        def __init__(self, config):
            super().__init__(config)
            self.gpt = TinyGPT()

        def forward(self, input_ids):
            return self.gpt(input_ids)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Own(transformers.PretrainedConfig()).eval()
    from attnscale.capture.route import choose

    assert choose(model) == "hf"
    stats = watch.measure_heads(model, {"input_ids": IDS})
    assert stats.layer_names == ("gpt.blocks.0", "gpt.blocks.1")
    torch.testing.assert_close(stats.values_LMH, watch.measure_heads(model.gpt, IDS).values_LMH, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="no attention call"):
        watch.measure_heads(model, {"input_ids": IDS}, capture="hf")


def test_hf_probes_in_two_threads_share_the_wrapper_and_the_last_puts_it_back():
    import threading

    a, b = llama(), llama()
    before = hf_state(a)
    seen = {"a": [], "b": []}
    inside, release = threading.Event(), threading.Event()

    def probe_b():
        with watch.capture_hf(b, seen["b"].append), torch.no_grad():
            inside.set()
            release.wait(30)
            b(**padded_batch())

    t = threading.Thread(target=probe_b)
    t.start()
    inside.wait(30)
    with watch.capture_hf(a, seen["a"].append), torch.no_grad():
        a(**padded_batch())
    release.set()  # a's probe is over; b's still runs through the wrapper
    t.join(30)
    assert len(seen["a"]) == len(seen["b"]) == 3
    assert hf_state(a) == before


def test_hf_auto_leaves_sdpa_alone_once_the_interface_delivered_and_probes_again_if_it_stops(monkeypatch):
    import importlib

    measure_module = importlib.import_module("attnscale.capture.route")
    model, batch = llama(), padded_batch()
    before = hf_state(model)
    entered = []
    real_sdpa = measure_module.capture_sdpa

    def counting_sdpa(*a, **kw):
        entered.append(1)
        return real_sdpa(*a, **kw)

    monkeypatch.setattr(measure_module, "capture_sdpa", counting_sdpa)
    route = measure_module.Route()  # what a Watch keeps between its probes
    first = watch.measure_heads(model, batch, route=route)
    assert len(entered) == 1  # the first probe listens to both
    watch.measure_heads(model, batch)
    assert len(entered) == 2  # a probe without the route learns nothing: both again
    entered.pop()
    second = watch.measure_heads(model, batch, route=route)
    assert len(entered) == 1  # the interface delivered: SDPA is left alone
    torch.testing.assert_close(second.values_LMH, first.values_LMH, rtol=0, atol=0)

    @contextlib.contextmanager
    def deaf(model_, on_call):  # as if the model's attention no longer went through the interface
        yield

    monkeypatch.setattr(measure_module, "capture_hf", deaf, raising=False)
    import attnscale.capture.hf as hf_capture

    monkeypatch.setattr(hf_capture, "capture_hf", deaf)
    third = watch.measure_heads(model, batch, route=route)
    assert len(entered) == 2  # it probed once more, with SDPA, and read the same heads there
    torch.testing.assert_close(third.values_LMH, first.values_LMH, rtol=1e-5, atol=1e-6)
    assert no_function_mode() and hf_state(model) == before


# ---- finite fills and biases: scores kept apart from masks ------------------------------------


def _filled_causal(fill):
    return torch.zeros(16, 16).masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), fill)


@pytest.mark.parametrize("fill", [-1e4, -1e9, torch.finfo(torch.float32).min])
def test_a_model_masked_with_a_finite_fill_measures_as_with_minus_inf(fill):
    want = watch.measure_heads(gpt(mask=_filled_causal(float("-inf"))), IDS).values_LMH
    got = watch.measure_heads(gpt(mask=_filled_causal(fill)), IDS).values_LMH
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert float(got[:, 1].max()) < 20  # max_score is a score, never the fill


def test_an_alibi_models_scores_are_its_q_k_alone_and_its_bias_is_reported_apart():
    alibi = _alibi_mask().masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), -1e9)
    with_bias = watch.measure_heads(gpt(mask=alibi), IDS)
    plain = watch.measure_heads(gpt(), IDS)  # the same weights, causal, no bias
    score = [0, 1]  # spread and max_score of layer 0 (layer 1 sees what layer 0's other weights made)
    torch.testing.assert_close(with_bias.values_LMH[0, score], plain.values_LMH[0, score], rtol=1e-6, atol=0)
    assert not torch.allclose(with_bias.get("effective_words")[0], plain.get("effective_words")[0])  # weights moved
    assert plain.bias_LH2 is None
    # each head's range over its visible keys: the farthest key of the last row (15 away), and the diagonal's 0
    slopes = [0.5, 0.25, 0.125, 0.0625]
    assert with_bias.bias_LH2[0, :, 0].tolist() == pytest.approx([-15 * s for s in slopes])
    assert with_bias.bias_LH2[0, :, 1].tolist() == [0.0] * 4
    flat = with_bias.flat()
    assert flat["attn/layer_0/head_1/bias_min"] == pytest.approx(-3.75) and "attn/layer_0/head_1/bias_min" not in plain.flat()
