"""capture.flex: direct flex_attention calls, read with the model's own score_mod and block mask.

The weights the reduction implies must be the probabilities flex itself uses (flex run on an identity value
matrix returns them), and every measure the float64 reference from flex's semantics: weights
softmax(score_mod(q·k × scale)) over the keys the block mask shows, the score measures read q·k × scale
before the score_mod. Shapes are tiny: flex runs unfused on the CPU (one small compile per new score_mod)."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
from torch import nn

import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attnscale import watch
from attnscale.capture.flex import block_mask_mod, capture_flex
from attnscale.capture.reduce import dense, reduce_call
from attnscale.capture.route import capturing, choose
from attnscale.errors import ConfigError
from modded_reference import assert_close, dense_index, pooled_measures, scores_of, weights_of

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
ORIGINAL = [flex_attention]  # in a list: no capture takes it for a holder of flex_attention

B, H, T, D = 2, 4, 24, 8
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 5)


def alibi(score, b, h, q_idx, kv_idx):
    return score - SLOPES[h] * (q_idx - kv_idx).abs()


def softcap(score, b, h, q_idx, kv_idx):
    return 2.0 * torch.tanh(score / 2.0)


def causal_by_score(score, b, h, q_idx, kv_idx):  # the older way to mask: a score_mod that writes -inf
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def hide_every_third(score, b, h, q_idx, kv_idx):  # hides keys 1, 4, 7, … (not a row's own) beside the block mask
    return torch.where((kv_idx % 3 == 1) & (kv_idx != q_idx), -float("inf"), score)


def hide_and_alibi(score, b, h, q_idx, kv_idx):  # the same keys hidden, ALiBi's slope on the others
    return hide_every_third(alibi(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)


class FlexAttention(nn.Module):
    """A torchtitan-shaped attention layer: q, k, v from one projection, flex_attention imported by name."""

    def __init__(self, d=32, heads=H, kv_heads=H, score_mod=None, mask_mod=causal):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, 2 * kv_heads * self.hd), nn.Linear(d, d)
        self.score_mod, self.mask_mod = score_mod, mask_mod
        self.seen = None

    def qkv(self, x):
        Bx, Tx, _ = x.shape
        q = self.q(x).view(Bx, Tx, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(Bx, Tx, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x):
        q, k, v = self.qkv(x)
        mask = None if self.mask_mod is None else create_block_mask(self.mask_mod, None, None, x.shape[1], x.shape[1],
                                                                     device="cpu")
        y = flex_attention(q, k, v, score_mod=self.score_mod, block_mask=mask, enable_gqa=self.kv_heads != self.heads)
        self.seen = (q, k, mask)
        return x + self.out(y.transpose(1, 2).reshape(*x.shape))


def net(layers=2, **kw):
    """An embedding, then ``layers`` residual flex attention layers named blocks.0, blocks.1, …"""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        blocks = nn.Sequential(*[FlexAttention(**kw) for _ in range(layers)])
        return nn.Sequential(OrderedDict(emb=nn.Embedding(50, 32), blocks=blocks)).eval()


IDS = torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(1))


def densified(mask_mod, heads=H):
    """A mask_mod as a dense boolean B×H×T×T, by hand."""
    b, h, i, j = dense_index(B, heads, T, T)
    return torch.as_tensor(mask_mod(b, h, i, j)).expand(B, heads, T, T)


def reference(layer: FlexAttention):
    """Flex's own semantics, in float64: the layer's q and k as it last ran."""
    q, k, _ = layer.seen
    scores = scores_of(q, k, layer.hd ** -0.5)
    visible = densified(layer.mask_mod) if layer.mask_mod is not None else torch.ones_like(scores, dtype=torch.bool)
    logits = scores if layer.score_mod is None else layer.score_mod(scores, *dense_index(B, H, T, T))
    visible = visible & (logits > -math.inf)
    return pooled_measures([(scores, weights_of(logits, visible), visible)])


CASES = {
    "causal": dict(),
    "sliding-window-alibi": dict(mask_mod=sliding, score_mod=alibi),
    "causal-softcap": dict(score_mod=softcap),
    "gqa-sliding-window": dict(kv_heads=2, mask_mod=sliding),
    "no-block-mask-causal-score-mod": dict(mask_mod=None, score_mod=causal_by_score),
    # keys hidden by the score_mod and by the block mask both: a key is seen only where both show it
    "causal-and-hiding-score-mod": dict(score_mod=hide_every_third),
    "sliding-window-and-hiding-alibi": dict(mask_mod=sliding, score_mod=hide_and_alibi),
}


@pytest.mark.parametrize("case", list(CASES))
def test_flex_calls_measure_as_flex_weighs(case, monkeypatch):
    if case != "causal":  # flex's own switch: its hop run as it is, not compiled first (0.5 s a new score_mod)
        monkeypatch.setattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    model = net(**CASES[case])
    with torch.no_grad():
        want = model(IDS)
    calls = []
    with capturing(model, calls.append) as kind, torch.no_grad():
        got = model(IDS)
    assert kind == "functions" and torch.equal(got, want)  # the model's outputs, untouched
    assert [c.name for c in calls] == ["blocks.0", "blocks.1"]
    for call, layer in zip(calls, model.blocks):
        q, k, mask = layer.seen
        # the weights the reduction reads are the probabilities flex uses: flex on an identity value matrix
        eye = torch.eye(T).expand(B, layer.kv_heads, T, T)
        probs = flex_attention(q, k, eye, score_mod=layer.score_mod, block_mask=mask, enable_gqa=layer.kv_heads != H)
        torch.testing.assert_close(dense(call)[1], probs, rtol=1e-5, atol=1e-6)
        # a row of a head at a time, or all at once
        memory = 1 if case in ("sliding-window-alibi", "sliding-window-and-hiding-alibi") else 256 << 20
        assert_close(reduce_call(call, memory=memory).measures(), reference(layer))
    if case == "causal":  # and through the probe
        assert_close(watch.measure_heads(model, IDS).values_LMH[0].double(), reference(model.blocks[0]))


def test_the_score_measures_read_the_score_before_the_score_mod_and_its_additions_are_the_bias_range():
    with_alibi, plain = net(score_mod=alibi), net()
    a, p = watch.measure_heads(with_alibi, IDS), watch.measure_heads(plain, IDS)
    torch.testing.assert_close(a.values_LMH[0, :2], p.values_LMH[0, :2], rtol=1e-6, atol=0)  # spread, max_score
    assert not torch.allclose(a.get("effective_words")[0], p.get("effective_words")[0])  # the weights moved
    # what the score_mod added over the visible keys: the farthest key of the last row, and the diagonal's 0
    assert a.bias_LH2[0, :, 0].tolist() == pytest.approx([-(T - 1) * s for s in SLOPES.tolist()])
    assert a.bias_LH2[0, :, 1].tolist() == [0.0] * H and p.bias_LH2 is None


def test_a_score_mod_that_writes_minus_inf_hides_the_key_from_every_measure():
    by_score = watch.measure_heads(net(mask_mod=None, score_mod=causal_by_score), IDS).values_LMH
    by_mask = watch.measure_heads(net(), IDS).values_LMH
    torch.testing.assert_close(by_score, by_mask, rtol=1e-6, atol=0)


@pytest.mark.parametrize("mask_mod, score_mod", [(causal, hide_every_third), (sliding, hide_and_alibi)])
def test_keys_hidden_by_a_score_mod_beside_a_block_mask_are_hidden_by_both(mask_mod, score_mod, monkeypatch):
    """A key is seen where the block mask shows it and the score_mod leaves it finite. The probe reads the float64
    reference of both together; a reading by either alone, or by either of the two, reads spread and max |score|
    otherwise (and effective words where the mask is dropped), so the reference tells each mix-up apart."""
    monkeypatch.setattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    model = net(layers=1, mask_mod=mask_mod, score_mod=score_mod)
    got = watch.measure_heads(model, IDS).values_LMH[0].double()
    layer = model.blocks[0]
    q, k, _ = layer.seen
    scores = scores_of(q, k, layer.hd ** -0.5)
    logits = score_mod(scores, *dense_index(B, H, T, T))
    mask, shown = densified(mask_mod), logits > -math.inf

    def read(visible):
        return pooled_measures([(scores, weights_of(logits.masked_fill(~visible, -math.inf), visible), visible)])

    want = read(mask & shown)
    assert_close(got, want)
    # the score_mod's hidden keys read as seen: their scores in spread and max |score| (their weights are 0);
    # the block mask's hidden keys read as seen (the mask dropped, or either one taken): all three move
    for wrong, moved in ((mask, (0, 1)), (shown, (0, 1, 2)), (mask | shown, (0, 1, 2))):
        other = read(wrong)
        for m in moved:  # spread, max |score|, effective words
            assert not torch.allclose(other[m], want[m], rtol=1e-3), (m, wrong.sum().item())


def test_a_block_mask_is_read_as_the_kernels_read_it():
    """A hand-made BlockMask: full blocks are seen whole, partial ones through the mask_mod, the rest hidden."""
    n = 4  # 4×4 blocks of 16 tokens over 64
    kv_num = torch.tensor([[[1, 1, 1, 0]]], dtype=torch.int32)  # partial: the diagonal block of rows 0-2
    kv_idx = torch.tensor([[[[0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]]], dtype=torch.int32)
    full_num = torch.tensor([[[0, 1, 2, 1]]], dtype=torch.int32)  # full: the blocks left of the diagonal, and 3→0
    full_idx = torch.tensor([[[[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]]], dtype=torch.int32)
    mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=16, mask_mod=causal,
                                    seq_lengths=(64, 64))
    i, j = torch.arange(64)[:, None], torch.arange(64)[None, :]
    qb, kb = i // 16, j // 16
    want = ((qb == kb) & (qb < 3) & (i >= j)) | ((kb < qb) & (qb < 3)) | ((qb == 3) & (kb == 0))
    got = block_mask_mod(mask)(*dense_index(1, 1, 64, 64))
    assert torch.equal(got[0, 0], want) and n == mask.kv_indices.shape[-1]


def test_nothing_stays_installed_and_an_error_inside_puts_it_back():
    import sys

    here = sys.modules[__name__]
    model = net()
    with pytest.raises(KeyError, match="boom"):
        with capture_flex(model, lambda call: (_ for _ in ()).throw(KeyError("boom"))):
            assert flex_module.flex_attention is not ORIGINAL[0]  # the library's and this file's name, wrapped
            assert here.flex_attention is not ORIGINAL[0]
            model(IDS)
    assert flex_module.flex_attention is here.flex_attention is ORIGINAL[0]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    seen, ran = [], []

    def elsewhere():
        with torch.no_grad():  # flex has no backward on the CPU
            ran.append(model(IDS))

    with capture_flex(model, seen.append):  # another thread's flex calls pass straight through the wrapper
        import threading

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(60)
    assert seen == [] and len(ran) == 1 and flex_module.flex_attention is ORIGINAL[0]


class Compiled(nn.Module):
    """torchtitan keeps a compiled flex_attention on its attention class."""

    compiled = torch.compile(flex_attention, backend="eager")

    def forward(self, q, k, v):
        return Compiled.compiled(q, k, v, score_mod=alibi)


def test_a_compiled_flex_on_a_class_is_read_and_put_back():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 12, D, generator=g) for _ in range(3))
    model, held = Compiled(), Compiled.compiled
    want = model(q, k, v)
    calls = []
    with capture_flex(model, calls.append):
        got = model(q, k, v)
    assert Compiled.compiled is held and torch.equal(got, want) and len(calls) == 1
    assert calls[0].score_mod is alibi and torch.equal(calls[0].q, q)


def test_forced_flex_auto_and_a_model_that_calls_nothing():
    model = net()
    assert choose(model) == "functions"
    forced = watch.measure_heads(model, IDS, capture="flex")
    torch.testing.assert_close(forced.values_LMH, watch.measure_heads(model, IDS).values_LMH, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="no attention call"):
        watch.measure_heads(model, IDS, capture="sdpa")  # flex calls are no SDPA calls


def test_qk_clip_refuses_a_score_mod_in_one_line_naming_the_module():
    from attnscale.watch.clip.qk_clip import QKClip

    model = net(score_mod=alibi)
    clip = QKClip(model, tau=10.0)
    try:
        with pytest.raises(ConfigError, match="'blocks.0'.*score_mod") as e:
            model(IDS)
        assert "\n" not in str(e.value)
    finally:
        clip.close()


def test_transformers_flex_block_mask_is_read_as_the_kernels_read_it():
    """hf_call's flex_attention path (transformers hands the BlockMask it built, and s_aux where it has one)."""
    from attnscale.capture.hf import hf_call

    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, 2, T, D, generator=g)
    mask = create_block_mask(sliding, None, None, T, T, device="cpu")
    sink = torch.zeros(H)
    call = hf_call(nn.Module(), "flex_attention", q, k, mask, {"scaling": 0.4, "s_aux": sink})
    assert torch.equal(call.visible().expand(B, H, T, T), densified(sliding)) and call.sink is not None
    assert call.scale == 0.4 and call.score_mod is None


FIRST_IMPORT = r"""
import json, math, sys, warnings
import torch
from torch import nn
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
from attnscale import watch
from modded_reference import pooled_measures, scores_of

class Late(nn.Module):  # flex_attention imported inside the forward, as some model files do
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qk = nn.Linear(16, 32)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention
        import torch.nn.attention.flex_attention as library
        library._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # flex's hop as it is: no compile in a fresh process
        q, k = self.qk(x).view(2, 5, 2, 2, 8).permute(2, 0, 3, 1, 4)
        self.seen = (q, k)
        return flex_attention(q, k, k)

x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
before = "torch.nn.attention.flex_attention" in sys.modules
model = Late().eval()
stats = watch.measure_heads(model, x)
q, k = model.seen
scores = scores_of(q, k, 8 ** -0.5)
visible = torch.ones_like(scores, dtype=torch.bool)
want = pooled_measures([(scores, torch.softmax(scores, -1), visible)])
err = ((stats.values_LMH[0].double() - want).abs() / want.abs().clamp_min(1e-12)).max().item()
print(json.dumps({"before": before, "names": stats.layer_names, "rows": stats.rows_LH.tolist(), "err": err}))
"""


def test_flex_attention_first_imported_inside_a_forward_is_seen_on_the_first_probe():
    """A fresh process, flex_attention never imported before the probe: the forward's own import gets the
    wrapper, and the call measures as the float64 reference (full attention over 5 keys, 2 heads)."""
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    out = subprocess.run([sys.executable, "-c", FIRST_IMPORT], env=env, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] is False  # the first import really is the forward's
    assert got["names"] == ["flex_attention call 0"]
    assert got["rows"] == [[10.0, 10.0]] and got["err"] < 1e-5
