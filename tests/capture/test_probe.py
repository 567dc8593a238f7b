"""attnscale.capture.probe: one probe, per-head numbers, the conditions it runs under.

The captures themselves are checked against each model's own weights in
test_watch_capture.py; here, what ``measure_heads`` promises around them."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscale import watch
from attnscale.core.diagnostics import COLLAPSED_WORDS, HEAD_MEASURES
from reference import head_measures
from attnscale.core.hooks import hooked
from attnscale.errors import ConfigError
from attnscale.lm.model import ModelConfig, build_model
from attnscale.capture.call import AttentionCall
from attnscale.capture.route import choose

IDS = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(0))


def tiny(**kw):
    base = dict(vocab_size=50, context=16, d_model=32, n_layers=3, n_heads=4, head_dim=8, init="unit")
    return build_model(ModelConfig(**{**base, **kw}), seed=0)


class SDPAModel(nn.Module):
    """Attention through F.scaled_dot_product_attention, with a dropout that eval mode must switch off."""

    def __init__(self, heads=(4, 4), dropout=0.5):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.qk = nn.ModuleList([nn.Linear(32, 2 * 32) for _ in heads])
        self.heads, self.drop = heads, nn.Dropout(dropout)

    def forward(self, idx):
        x = self.drop(self.emb(idx))
        B, T, C = x.shape
        for qk, H in zip(self.qk, self.heads):
            q, k = qk(x).view(B, T, 2, H, C // H).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, k, is_causal=True).transpose(1, 2).reshape(B, T, C)
        return x


def own_measures(model, ids):
    """head_measures on the scores and weights an attnscale model computes itself."""
    with hooked(model, ["*hook_scores", "*hook_pattern"]) as cache, torch.no_grad():
        model(ids)
    n = model.cfg.n_layers
    return torch.stack([head_measures(cache[f"blocks.{i}.attn.hook_scores"], cache[f"blocks.{i}.attn.hook_pattern"])
                        for i in range(n)])


@pytest.mark.parametrize("scale", ["inv_sqrt_d", "none", "qk_norm", "softcap", "learned_temp"])
def test_attnscale_models_through_their_hooks_equal_their_own_weights(scale):
    model = tiny(scale=scale)
    stats = watch.measure_heads(model, IDS)
    assert stats.values_LMH.dtype == torch.float32 and stats.values_LMH.device.type == "cpu"
    assert stats.rows_LH.dtype == torch.float64 and stats.rows_LH.shape == (3, 4)
    assert stats.measures == HEAD_MEASURES and stats.layer_names == ("blocks.0.attn", "blocks.1.attn", "blocks.2.attn")
    torch.testing.assert_close(stats.values_LMH, own_measures(model, IDS), rtol=1e-5, atol=1e-7)
    assert stats.rows_LH.unique().tolist() == [3 * 15]  # every row but the first of each sequence


def test_flat_keys_and_the_summary():
    stats = watch.measure_heads(tiny(), IDS)
    flat = watch.measure(tiny(), IDS)
    keys = [f"attn/layer_{l}/head_{h}/{m}" for l in range(3) for h in range(4) for m in HEAD_MEASURES]
    summary = ["attn/max_score", "attn/min_effective_words", "attn/frozen_fraction", "attn/collapsed_heads",
               "attn/nonfinite_heads"]
    assert list(flat) == keys + summary
    assert flat == stats.flat() and all(isinstance(v, float) for v in flat.values())
    assert flat["attn/layer_2/head_1/spread"] == stats.get("spread")[2, 1].item()
    s = stats.summary()
    assert s["attn/max_score"] == stats.get("max_score").max().item()
    assert s["attn/min_effective_words"] == stats.get("effective_words").min().item()
    rows = stats.rows_LH
    want = (stats.get("frozen_fraction").double() * rows).sum() / rows.sum()
    assert s["attn/frozen_fraction"] == pytest.approx(want.item(), rel=1e-12)
    assert s["attn/collapsed_heads"] == float((stats.get("effective_words") < COLLAPSED_WORDS).sum())
    with pytest.raises(KeyError, match="no measure"):
        stats.get("entropy")


def test_a_loud_model_has_collapsed_and_frozen_heads():
    stats = watch.measure_heads(tiny(scale="none", head_dim=256), IDS)
    s = stats.summary()
    assert s["attn/collapsed_heads"] > 0 and s["attn/frozen_fraction"] > 0.1 and s["attn/max_score"] > 10


def test_probe_runs_in_eval_without_grad_and_restores_each_modules_mode():
    model = SDPAModel()
    model.train()
    model.qk[1].eval()  # a module the user froze: it stays as it was
    want = [m.training for m in model.modules()]
    a = watch.measure_heads(model, IDS)
    b = watch.measure_heads(model, IDS)
    torch.testing.assert_close(a.values_LMH, b.values_LMH, rtol=0, atol=0)  # dropout was off
    assert [m.training for m in model.modules()] == want


def test_autocast_is_off_and_scores_are_fp32_from_a_bf16_model():
    model = SDPAModel(dropout=0.0)
    want = watch.measure_heads(model, IDS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = watch.measure_heads(model, IDS)
    torch.testing.assert_close(got.values_LMH, want.values_LMH, rtol=0, atol=0)

    model = model.to(torch.bfloat16)
    calls = []
    with watch.capture_sdpa(model, calls.append), torch.no_grad():
        model(IDS)
    stats = watch.measure_heads(model, IDS)
    assert calls[0].q.dtype == torch.bfloat16
    for i, c in enumerate(calls):  # the reference: q and k taken to fp32 first, then the scores
        T = c.q.shape[-2]
        scores = (c.q.float() @ c.k.float().transpose(-2, -1)) * c.factor
        visible = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
        ref = head_measures(scores, torch.softmax(scores, -1))
        torch.testing.assert_close(stats.values_LMH[i], ref, rtol=1e-5, atol=1e-7)


def test_layers_of_different_widths_are_padded_with_nan():
    stats = watch.measure_heads(SDPAModel(heads=(4, 2), dropout=0.0), IDS)
    assert stats.values_LMH.shape == (2, len(HEAD_MEASURES), 4) and stats.layer_heads == (4, 2)
    assert torch.isnan(stats.values_LMH[1, :, 2:]).all() and (stats.rows_LH[1, 2:] == 0).all()
    flat = stats.flat()
    assert "attn/layer_1/head_1/spread" in flat and "attn/layer_1/head_2/spread" not in flat
    assert not math.isnan(flat["attn/max_score"])


def test_choice_of_capture():
    class Plain(nn.Module):
        def forward(self, x):
            return x

    assert choose(tiny()) == "hooks" and choose(SDPAModel()) == "functions"  # SDPA, flex_attention, flash-attn
    assert choose(tiny(), adapter=watch.Adapter("x", lambda *a: None)) == "adapter"
    assert choose(tiny(), "sdpa") == "sdpa"
    with pytest.raises(ConfigError, match="capture must be one of"):
        choose(tiny(), "xformers")
    with pytest.raises(ConfigError, match="needs an adapter"):
        choose(tiny(), "adapter")
    with pytest.raises(ConfigError, match="no attention call") as e:
        watch.measure(nn.Sequential(nn.Embedding(50, 8), Plain()), IDS)
    assert "\n" not in str(e.value) and "Adapter" in str(e.value)
    # forced: hooks on a model that has none
    with pytest.raises(ConfigError, match="no attnscale Attention"):
        watch.measure(SDPAModel(), IDS, capture="hooks")


def test_sdpa_capture_of_an_attnscale_model_equals_its_hooks():
    """The fused path (SDPA) and the hooks read the same q and k."""
    model = tiny()
    torch.testing.assert_close(watch.measure_heads(model, IDS, capture="sdpa").values_LMH,
                               watch.measure_heads(model, IDS).values_LMH, rtol=1e-5, atol=1e-7)


def test_padding_of_a_dict_batch_is_neither_row_nor_key():
    """A dict batch's attention_mask takes padding out of the rows and keys: what the padded
    positions hold changes nothing, and the counted rows are the real ones."""

    class Keyed(SDPAModel):
        def forward(self, input_ids, attention_mask):  # a model that ignores its mask entirely
            return super().forward(input_ids)

    model = Keyed(dropout=0.0)
    pad = torch.ones(3, 16, dtype=torch.long)
    pad[1, 10:] = 0
    ids = IDS.clone()
    a = watch.measure_heads(model, {"input_ids": ids, "attention_mask": pad})
    assert a.rows_LH.unique().tolist() == [15 + 9 + 15]
    ids[1, 10:] = 7  # the padded tail changes; the causal rows before it never saw it
    b = watch.measure_heads(model, {"input_ids": ids, "attention_mask": pad})
    torch.testing.assert_close(a.values_LMH, b.values_LMH, rtol=0, atol=0)


class PaddedSDPA(SDPAModel):
    """Takes its ids positionally and its padding by keyword, as ``model(ids, attention_mask=m)``; ignores the mask
    (the probe must take the padding out itself)."""

    def forward(self, ids, attention_mask=None):
        return super().forward(ids)


def test_the_watch_keeps_a_caught_batch_as_the_model_was_given_it():
    """Positional ids and a keyword padding mask stay together: the padding is neither row nor key."""
    model = PaddedSDPA(dropout=0.0)
    pad = torch.ones(3, 16, dtype=torch.long)
    pad[1, 10:] = 0
    w = watch.Watch(model, every=1)
    model(IDS, attention_mask=pad)  # the first forward: caught as the probe
    assert isinstance(w.probe, watch.Inputs) and torch.equal(w.probe.kwargs["attention_mask"], pad)
    numbers = w.step(1)
    w.close()
    want = watch.measure_heads(model, {"ids": IDS, "attention_mask": pad}).flat()
    # the real rows: 15 + 9 + 15 that see two keys or more
    assert watch.measure_heads(model, watch.Inputs((IDS,), {"attention_mask": pad})).rows_LH.unique().tolist() == [39]
    assert {k: numbers[k] for k in want} == pytest.approx(want)


@pytest.mark.parametrize("probe", [(IDS,), [IDS], watch.Inputs((IDS,), {})], ids=["tuple", "list", "inputs"])
def test_a_probe_may_be_a_tuple_a_list_or_inputs(probe):
    model = SDPAModel(dropout=0.0)
    w = watch.Watch(model, every=1, probe=probe, probe_sequences=2)
    got = w.step(1)
    w.close()
    assert got["attn/max_score"] == pytest.approx(watch.measure(model, IDS[:2])["attn/max_score"])


def test_a_probe_of_anything_else_is_refused_by_name():
    with pytest.raises(ConfigError, match="a probe batch is a tensor, a dict, tuple, list or dataclass of tensors"):
        watch.Watch(SDPAModel(), probe="text")


def test_memory_and_sample_rows_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="memory takes a positive integer"):
        watch.Watch(SDPAModel(), memory=0)
    with pytest.raises(ValueError, match="sample_rows takes an integer of at least 2"):
        watch.Watch(SDPAModel(), sample_rows=1)
    with pytest.raises(ConfigError, match=r"memory takes a positive integer \(bytes\)"):
        watch.measure_heads(SDPAModel(), IDS, memory=-5)


def test_a_small_budget_and_sampled_rows_in_a_probe():
    model = SDPAModel(dropout=0.0)
    whole = watch.measure_heads(model, IDS)
    tight = watch.measure_heads(model, IDS, memory=1)  # a single row of a single head at a time
    torch.testing.assert_close(tight.values_LMH, whole.values_LMH, rtol=1e-6, atol=1e-7)
    sampled = watch.measure_heads(model, IDS, sample_rows=8)
    assert sampled.errors_LRH is not None and sampled.errors_LRH.shape == (whole.layers, 4, whole.heads)
    assert whole.errors_LRH is None
    assert float(sampled.rows_LH.max()) <= 3 * 8


def test_a_sampled_probe_takes_the_fused_route_and_says_so():
    """Through SDPA, causal, with padding: spread, max |score| and effective words from every row as the probe of
    every row reads them; the other row measures from the sampled rows; each layer's method in the stats."""
    model = PaddedSDPA(dropout=0.0)
    batch = watch.Inputs((IDS,), {"attention_mask": torch.ones(3, 16, dtype=torch.long).index_fill_(1, torch.arange(12, 16), 0)})
    whole = watch.measure_heads(model, batch)
    sampled = watch.measure_heads(model, batch, sample_rows=5)
    assert sampled.layer_methods == ("fused", "fused") and whole.layer_methods == ("replay", "replay")
    torch.testing.assert_close(sampled.values_LMH[:, :3], whole.values_LMH[:, :3], rtol=1e-5, atol=0)
    assert float(sampled.rows_LH.max()) <= 3 * 5


def test_attention_call_reads_like_sdpa():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    call = AttentionCall(q, k, is_causal=True, softcap=3.0)
    assert (call.heads, call.kv_heads, call.factor) == (4, 2, 8**-0.5)
    assert call.visible().shape == (1, 1, 5, 5) and call.visible()[0, 0].equal(torch.ones(5, 5, dtype=torch.bool).tril())
    assert call.squash()(torch.tensor([100.0])).item() == pytest.approx(3.0)
    assert AttentionCall(q, k).visible() is None and AttentionCall(q, k).squash() is None


def test_import_watch_does_not_import_transformers():
    code = ("import sys, attnscale.watch as w; w.measure, w.Watch; assert 'transformers' not in sys.modules; "
            "assert 'torch.nn.attention.flex_attention' not in sys.modules and 'flash_attn' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_compiled_and_data_parallel_models_are_probed_through_their_own_module():
    model = SDPAModel(dropout=0.0)
    want = watch.measure_heads(model, IDS).values_LMH
    compiled = torch.compile(model, backend="eager")  # never compiled: the probe runs the original eagerly
    assert torch.equal(watch.measure_heads(compiled, IDS).values_LMH, want)
    assert torch.equal(watch.measure_heads(nn.DataParallel(model), IDS).values_LMH, want)


def test_inputs_go_to_the_input_embedding_of_a_model_spread_over_devices():
    """A model placed with device_map starts where its input embedding is, not where its first parameter is."""
    from attnscale.capture.probe import input_device

    class Spread(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(2, 2)  # the first parameter, on the CPU
            self.emb = nn.Embedding(5, 2, device="meta")

        def get_input_embeddings(self):
            return self.emb

    assert input_device(Spread()).type == "meta" and input_device(SDPAModel()).type == "cpu"
    assert input_device(nn.ReLU()).type == "cpu"


def test_float_token_ids_are_refused_at_the_call_naming_the_fix():
    """An input embedding takes integer ids: float ids would fail deep inside torch's embedding."""
    model = build_model(ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=1, n_heads=2, head_dim=8), seed=0)
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match=r"^the embedding 'tok_emb' of TinyLM takes integer token ids, got "
                                          r"torch.float32 ones; give the ids as integers: ids.long\(\)$"):
        watch.measure(model, ids.float())
    assert watch.measure(model, ids)["attn/max_score"] > 0  # the same ids as integers: measured
