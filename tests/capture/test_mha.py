"""PyTorch's own attention (``nn.MultiheadAttention``, ``nn.Transformer*``) read at
``F.multi_head_attention_forward``: every variant measures as a float64 reference written out here from the
module's weights (q = x W_qᵀ + b_q, k = x W_kᵀ + b_k, scores q·kᵀ / sqrt(head_dim), the masks as torch documents
them, the softmax), to 1e-5; the reference's weights are checked against the ones torch itself returns."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscale import watch
from modded_reference import assert_close, pooled_measures

pytestmark = [pytest.mark.filterwarnings("ignore:Support for mismatched"),
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")]
E, H, B, T = 16, 4, 2, 7


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def causal_hidden(T, S=None):
    """torch's boolean attn_mask: True where a key is hidden (the future)."""
    return torch.ones(T, T if S is None else S, dtype=torch.bool).triu(1)


@torch.no_grad()
def reference(m: nn.MultiheadAttention, query, key, attn_mask=None, key_padding_mask=None):
    """(scores, weights, visible) B×H×T×S float64 and the measures: ``query`` B×T×E and ``key`` B×S×kdim
    batch-first, ``attn_mask`` T×S or (B·H)×T×S (boolean True = hidden, or additive float), ``key_padding_mask``
    B×S (True = padded). Padded tokens of a self-attention are no query rows either."""
    D = E // H
    if m._qkv_same_embed_dim:
        w_q, w_k = m.in_proj_weight[:E], m.in_proj_weight[E:2 * E]
    else:
        w_q, w_k = m.q_proj_weight, m.k_proj_weight
    b_q, b_k = m.in_proj_bias[:E], m.in_proj_bias[E:2 * E]
    n, t, s = query.shape[0], query.shape[1], key.shape[1]
    q = (query.double() @ w_q.double().T + b_q.double()).view(n, t, H, D).transpose(1, 2)
    k = (key.double() @ w_k.double().T + b_k.double()).view(n, s, H, D).transpose(1, 2)
    extra = 0
    if m.bias_k is not None:  # one more key, the learned one, for every sequence
        k = torch.cat([k, m.bias_k.double().view(1, H, 1, D).expand(n, -1, -1, -1)], dim=2)
        extra += 1
    if m.add_zero_attn:
        k = torch.cat([k, torch.zeros(n, H, 1, D, dtype=torch.float64)], dim=2)
        extra += 1
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    S = s + extra
    hidden = torch.zeros(n, H, t, S, dtype=torch.bool)
    bias = torch.zeros(n, H, t, S, dtype=torch.float64)
    if attn_mask is not None:
        am = attn_mask.view(n, H, t, s) if attn_mask.dim() == 3 else attn_mask[None, None]
        am = torch.nn.functional.pad(am, (0, extra), value=False if am.dtype == torch.bool else 0.0)
        if am.dtype == torch.bool:
            hidden |= am
        else:
            hidden |= am == -math.inf
            bias += torch.where(am == -math.inf, 0.0, am.double())
    if key_padding_mask is not None:
        hidden |= torch.nn.functional.pad(key_padding_mask, (0, extra), value=False)[:, None, None, :]
        if query is key:
            hidden |= key_padding_mask[:, None, :, None]
    visible = ~hidden
    weights = torch.softmax((scores + bias).masked_fill(hidden, -math.inf), -1).nan_to_num(0.0)
    return scores, weights, visible, pooled_measures([(scores, weights, visible)])


def probe(m, *args, **kwargs):
    return watch.measure_heads(m, watch.Inputs(args, kwargs))


def biased(model):
    """torch starts ``in_proj_bias`` at zero: random biases, so that b_q and b_k are read where they are."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.MultiheadAttention):
                m.in_proj_bias.normal_()
    return model


def mha(seed=1, **kw):
    torch.manual_seed(seed)
    return biased(nn.MultiheadAttention(E, H, **kw).eval())


def padding():
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 4:] = True  # the second sequence: 4 tokens, then 3 of padding
    return pad


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_equals_the_reference_and_torchs_own_weights(batch_first, need_weights):
    m = mha(batch_first=batch_first)
    x = rand(B, T, E)
    given = x if batch_first else x.transpose(0, 1)
    stats = probe(m, given, given, given, need_weights=need_weights)
    _, weights, _, want = reference(m, x, x)
    assert stats.layer_names == ("multi_head_attention call 0",) and stats.layer_heads == (H,)
    assert_close(stats.values_LMH[0].double(), want)
    assert stats.rows_LH.tolist() == [[B * T] * H]
    with torch.no_grad():  # the reference's weights are torch's own
        _, theirs = m(given, given, given, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(theirs.double(), weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_padded_keys_are_hidden_and_their_rows_do_not_count(kind):
    m = mha(batch_first=True)
    x, pad = rand(B, T, E, seed=2), padding()
    given = pad if kind == "bool" else torch.zeros(B, T).masked_fill(pad, -math.inf)
    stats = probe(m, x, x, x, key_padding_mask=given)
    scores, weights, visible, want = reference(m, x, x, key_padding_mask=pad)
    assert_close(stats.values_LMH[0], want)
    assert stats.rows_LH.tolist() == [[T + 4] * H]  # the padded rows of the second sequence left out
    with torch.no_grad():
        _, theirs = m(x, x, x, key_padding_mask=given, average_attn_weights=False)
    torch.testing.assert_close(theirs[0].double(), weights[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(theirs[1, :, :4].double(), weights[1, :, :4], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["bool", "float", "float-bias", "per-head"])
def test_attn_masks_hide_their_keys_and_a_float_one_is_a_bias(kind):
    m = mha(batch_first=True)
    x = rand(B, T, E, seed=3)
    hidden = causal_hidden(T)
    if kind == "bool":
        mask = hidden
    elif kind == "float":
        mask = torch.zeros(T, T).masked_fill(hidden, -math.inf)
    elif kind == "float-bias":  # ALiBi-like: visible keys get -0.3 per step back, which enters the weights only
        steps = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
        mask = (-0.3 * steps).masked_fill(hidden, -math.inf)
    else:  # (B·H)×T×S: each sequence and head its own window
        mask = torch.stack([causal_hidden(T) | (torch.ones(T, T, dtype=torch.bool).tril(-2 - h % 3))
                            for _ in range(B) for h in range(H)])
    pad = padding()
    stats = probe(m, x, x, x, attn_mask=mask, key_padding_mask=pad)
    scores, weights, visible, want = reference(m, x, x, attn_mask=mask, key_padding_mask=pad)
    assert_close(stats.values_LMH[0], want)
    rows = (visible.sum(-1) >= 2).sum((0, 2)).double()
    assert stats.rows_LH[0].tolist() == rows.tolist()
    if kind == "float-bias":  # the bias's range over the visible keys: 0 on the diagonal, -0.3·6 at most
        assert stats.bias_LH2[0, :, 0].tolist() == pytest.approx([-0.3 * 6] * H)
        assert stats.bias_LH2[0, :, 1].tolist() == [0.0] * H
    with torch.no_grad():
        _, theirs = m(x, x, x, attn_mask=mask, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(theirs[0].double(), weights[0], rtol=1e-5, atol=1e-6)


def test_the_is_causal_hint_without_weights_reads_as_the_mask():
    """torch hands SDPA is_causal and drops the mask there; with weights it keeps the mask: the same numbers."""
    m = mha(batch_first=True)
    x = rand(B, T, E, seed=4)
    mask = causal_hidden(T)
    hint = probe(m, x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
    kept = probe(m, x, x, x, attn_mask=mask, need_weights=True)
    want = reference(m, x, x, attn_mask=mask)[3]
    assert_close(hint.values_LMH[0], want)
    assert_close(kept.values_LMH[0], want)
    assert hint.rows_LH.tolist() == [[B * (T - 1)] * H]  # the first row sees one key


def test_kdim_and_vdim_other_than_embed_dim_a_cross_attention():
    m = mha(batch_first=True, kdim=6, vdim=5)
    x, memory = rand(B, T, E, seed=5), rand(B, 11, 6, seed=6)
    mem_pad = torch.zeros(B, 11, dtype=torch.bool)
    mem_pad[0, 8:] = True
    stats = probe(m, x, memory, rand(B, 11, 5, seed=7), key_padding_mask=mem_pad)
    _, weights, _, want = reference(m, x, memory, key_padding_mask=mem_pad)
    assert_close(stats.values_LMH[0], want)
    assert stats.rows_LH.tolist() == [[B * T] * H]  # a cross-attention keeps every query row


def test_bias_kv_zero_attention_and_an_unbatched_sequence():
    m = mha(add_bias_kv=True, add_zero_attn=True)
    with torch.no_grad():
        m.bias_k.normal_()
    x = rand(T, E, seed=8)  # unbatched: (T, E)
    mask = causal_hidden(T)
    stats = probe(m, x, x, x, attn_mask=mask)
    scores, weights, visible, want = reference(m, x[None], x[None], attn_mask=mask)
    assert scores.shape[-1] == T + 2
    assert_close(stats.values_LMH[0], want)
    with torch.no_grad():
        _, theirs = m(x, x, x, attn_mask=mask, average_attn_weights=False)
    torch.testing.assert_close(theirs.double(), weights[0], rtol=1e-5, atol=1e-6)


def ran(model, *args, **kwargs) -> set[str]:
    """The aten ops a plain eval forward without gradients runs (no capture): which path torch took."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(*args, **kwargs)
    return {e.name for e in prof.events()}


def test_the_eval_fast_path_is_measured_on_the_same_weights():
    m = mha(batch_first=True)
    x, pad = rand(B, T, E, seed=9), padding()
    assert "aten::_native_multi_head_attention" in ran(m, x, x, x, key_padding_mask=pad)  # torch's fast path
    stats = probe(m, x, x, x, key_padding_mask=pad)
    assert_close(stats.values_LMH[0], reference(m, x, x, key_padding_mask=pad)[3])


def inputs_of(model):
    """Each MultiheadAttention's (query, key, attn_mask, key_padding_mask) in a forward: pre-hooks record them."""
    seen, handles = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            def hook(mod, args, kwargs, name=name):
                q, k = args[0], args[1]
                if not mod.batch_first:
                    q, k = q.transpose(0, 1), k.transpose(0, 1)
                # torch's layers give their masks as float (-inf); the reference reads them as they are
                seen[name] = (mod, q, q if args[0] is args[1] else k, kwargs.get("attn_mask"),
                              kwargs.get("key_padding_mask"))
            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


def by_reference(model, run):
    seen, handles = inputs_of(model)
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # no nested tensors: each layer's input as a plain tensor
    try:
        with torch.no_grad():
            run()
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
        for h in handles:
            h.remove()
    out = {}
    for name, (m, q, k, am, kpm) in seen.items():
        kpm = None if kpm is None else (kpm if kpm.dtype == torch.bool else kpm == -math.inf)
        out[name] = reference(m, q, k, attn_mask=am, key_padding_mask=kpm)[3]
    return out


@pytest.mark.parametrize("batch_first", [True, False])
def test_a_transformer_encoder_equals_the_reference_layer_by_layer(batch_first):
    torch.manual_seed(10)
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=batch_first)
    enc = biased(nn.TransformerEncoder(layer, 2, enable_nested_tensor=batch_first).eval())
    x, pad = rand(B, T, E, seed=11), padding()
    src = x if batch_first else x.transpose(0, 1)
    if batch_first:  # torch would take its fused layers over nested tensors: the probe reads them all the same
        assert "aten::_transformer_encoder_layer_fwd" in ran(enc, src, src_key_padding_mask=pad)
    batch = {"src": src, "src_key_padding_mask": pad}
    stats = watch.measure_heads(enc, batch)
    want = by_reference(enc, lambda: enc(**batch))
    assert stats.layer_names == ("layers.0.self_attn", "layers.1.self_attn") == tuple(want)
    for l, name in enumerate(stats.layer_names):
        assert_close(stats.values_LMH[l], want[name])
    assert stats.rows_LH.unique().tolist() == [T + 4]


def test_a_causal_encoder_and_a_whole_transformer():
    torch.manual_seed(12)
    model = nn.Transformer(E, H, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=32, dropout=0.0,
                           batch_first=True).eval()
    biased(model)
    src, tgt, pad = rand(B, 9, E, seed=13), rand(B, T, E, seed=14), padding()
    mem_pad = torch.zeros(B, 9, dtype=torch.bool)
    mem_pad[0, 6:] = True
    batch = {"src": src, "tgt": tgt, "tgt_mask": nn.Transformer.generate_square_subsequent_mask(T),
             "tgt_is_causal": True, "src_key_padding_mask": mem_pad, "tgt_key_padding_mask": pad,
             "memory_key_padding_mask": mem_pad}
    stats = watch.measure_heads(model, batch)
    want = by_reference(model, lambda: model(**batch))
    assert stats.layer_names == ("encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                                 "decoder.layers.0.multihead_attn", "decoder.layers.1.self_attn",
                                 "decoder.layers.1.multihead_attn") == tuple(want)
    for l, name in enumerate(stats.layer_names):
        assert_close(stats.values_LMH[l], want[name])
    # the decoder's self-attention: causal, the second target padded after 4 tokens (its first row sees one key)
    assert stats.rows_LH[1].tolist() == [(T - 1) + 3] * H
    # its cross-attention: every target row (the target's padding is not handed to it), each seeing 6 or 9 keys
    assert stats.rows_LH[2].tolist() == [B * T] * H


def test_a_causal_decoder_layer_alone():
    torch.manual_seed(15)
    layer = biased(nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=True, norm_first=True).eval())
    tgt, memory = rand(B, T, E, seed=16), rand(B, 5, E, seed=17)
    batch = {"tgt": tgt, "memory": memory, "tgt_mask": causal_hidden(T), "tgt_is_causal": True}
    stats = watch.measure_heads(layer, batch)
    want = by_reference(layer, lambda: layer(**batch))
    assert stats.layer_names == ("self_attn", "multihead_attn")
    for l, name in enumerate(stats.layer_names):
        assert_close(stats.values_LMH[l], want[name])
    assert stats.rows_LH.tolist() == [[B * (T - 1)] * H, [B * T] * H]


def test_the_watch_in_the_training_forward_reads_an_encoder(tmp_path):
    """Train mode with gradients (no fast path to skip): the step's own forward, numbers as the reference's."""
    from attnscale.watch.logs.line import read_log
    from attnscale.watch.logs.sinks import JsonlSink

    torch.manual_seed(18)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True), 2,
                                enable_nested_tensor=False)
    biased(enc)
    x, pad = rand(B, T, E, seed=19), padding()
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    batch = {"src": x, "mask": mask, "is_causal": True, "src_key_padding_mask": pad}
    want = by_reference(enc, lambda: enc(**batch))
    opt = torch.optim.SGD(enc.parameters(), lr=0.0)
    with watch.Watch(enc, every=1, alerts=(), in_training_forward=True, sinks=[JsonlSink(tmp_path / "w.jsonl")]) as w:
        enc.train()
        enc(**batch).sum().backward()
        opt.step()
        w.step(1)
    [baseline, record] = read_log(tmp_path / "w.jsonl")  # lr 0: the baseline reads what step 1 reads
    assert baseline.step == 0 and baseline.values == record.values
    for l, name in enumerate(("layers.0.self_attn", "layers.1.self_attn")):
        assert_close(torch.tensor(record.values[l]), want[name])
    assert record.rows == [[(T - 1) + 3] * H] * 2
