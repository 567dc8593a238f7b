"""Packed sequences through transformers, and attention sinks.

A packed row of three documents must measure as its documents measured alone, rows pooled (1e-5): through
the sdpa mask transformers builds from position_ids that restart, and through its flash path's
``cu_seq_lens_q``/``cu_seq_lens_k`` or position_ids (read by ``hf_call``; flash-attn is not installed here).
A sink (gpt-oss's ``s_aux``) is in every row's softmax denominator and nowhere else: by hand on one row, by
the reference on whole calls, and on a tiny gpt-oss against its own eager weights."""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnscale import watch
from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import dense, reduce_call
from attnscale.capture.sums import HeadSums
from attnscale.core import diagnostics as D
from modded_reference import assert_close, per_document, pooled_measures, scores_of, weights_of

DOCS = (5, 9, 7)


# ---- sinks --------------------------------------------------------------------------------------


def _one_row(sink):
    sums = HeadSums(1)
    logits = torch.tensor([[[[0.0, math.log(3.0)]]]])  # one row over two keys: e = 1 and 3
    sums.add_block(logits, torch.ones(1, 1, 1, 2, dtype=torch.bool), sink=None if sink is None else torch.tensor([sink]))
    return dict(zip(D.HEAD_MEASURES, sums.measures()[:, 0].tolist()))


def test_a_sink_by_hand():
    """Keys e = 1, 3 and a sink e = 4: the keys' weights are 1/8 and 3/8, the sink takes the other half."""
    m = _one_row(math.log(4.0))
    p = (1 / 8, 3 / 8)
    assert m["effective_words"] == pytest.approx(math.exp(-sum(x * math.log(x) for x in p)), rel=1e-7)  # ln 3 in fp32
    assert m["max_weight"] == pytest.approx(3 / 8, rel=1e-7) and m["frozen_fraction"] == 0.0
    s2, s3 = sum(x**2 for x in p), sum(x**3 for x in p)  # the keys' Jacobian diag(p) - p pᵀ, the sink held
    assert m["push"] == pytest.approx(math.sqrt(s2 - 2 * s3 + s2**2), rel=1e-7)
    # the sink is no score: spread and max_score are the two keys' alone
    assert m["spread"] == pytest.approx(math.log(3.0) / 2, rel=1e-6) and m["max_score"] == pytest.approx(math.log(3.0))
    assert _one_row(-math.inf) == _one_row(None)  # a sink of -inf takes nothing
    huge = _one_row(1e4)  # a sink far above every key: the keys keep almost nothing, and nothing is NaN
    assert huge["effective_words"] == pytest.approx(1.0) and huge["max_weight"] < 1e-200 and huge["push"] < 1e-200


@pytest.mark.parametrize("memory", [256 << 20, 1])
def test_a_call_with_a_sink_equals_the_reference(memory):
    g = torch.Generator().manual_seed(5)
    q, k = 2 * torch.randn(2, 4, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g)
    sink = torch.tensor([-1.0, 0.0, 2.0, 6.0])
    call = AttentionCall(q, k, is_causal=True, sink=sink)
    scores = scores_of(q, k, 8 ** -0.5)
    visible = torch.ones(11, 11, dtype=torch.bool).tril()[None, None].expand_as(scores)
    weights = weights_of(scores, visible, sink)
    torch.testing.assert_close(dense(call)[1].double(), weights, rtol=1e-5, atol=1e-7)
    assert_close(reduce_call(call, memory=memory).measures(), pooled_measures([(scores, weights, visible)]))


transformers = pytest.importorskip("transformers")


def test_gpt_oss_sinks_measure_as_its_own_eager_weights():
    from test_capture_calls import Softmaxes

    transformers.logging.set_verbosity_error()  # a tiny config's RoPE scaling warning
    cfg = transformers.GptOssConfig(vocab_size=60, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                    num_experts_per_tok=1, sliding_window=4, max_position_embeddings=64,
                                    attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.GptOssModel(cfg).eval()
        with torch.no_grad():
            for block in model.layers:
                block.self_attn.sinks.normal_(0.0, 2.0)
    batch = {"input_ids": torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(1))}
    calls = []
    with watch.capture_hf(model, calls.append), torch.no_grad(), Softmaxes() as grab:
        out = model(**batch, output_attentions=True)
    assert [c.sink is not None for c in calls] == [True, True]
    stats = watch.measure_heads(model, batch)
    attention = [x for x in grab.inputs if x.ndim == 4]  # not the experts' router
    for layer, (call, logits, weights) in enumerate(zip(calls, attention, out.attentions)):
        visible = logits[..., :-1] > torch.finfo(logits.dtype).min / 2  # the last column is the sink's
        scores = scores_of(call.q, call.k, call.factor)
        want = pooled_measures([(scores, weights.double(), visible)])
        assert_close(stats.values_LMH[layer].double(), want)
    assert bool((stats.get("max_weight") < 0.9).all())  # the sinks took weight from the rows


# ---- packed sequences through transformers -------------------------------------------------------


def _positions():
    return torch.cat([torch.arange(n) for n in DOCS])[None]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("impl", ["sdpa", "flex_attention"])
def test_a_packed_llama_row_equals_its_documents_alone(impl, monkeypatch):
    """transformers builds the block-diagonal mask from position_ids that restart (without a cache): sdpa's as a
    boolean mask, flex's as a BlockMask (read as its kernels read it); every measure against float64 per document."""
    import torch.nn.attention.flex_attention as flex_module
    from test_capture_calls import llama

    monkeypatch.setattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)  # flex unfused, no compile
    model = llama(attn_implementation=impl)
    ids = torch.randint(1, 120, (1, sum(DOCS)), generator=torch.Generator().manual_seed(6))
    packed = {"input_ids": ids, "position_ids": _positions(), "use_cache": False}
    stats = watch.measure_heads(model, packed)
    calls, start = [], 0
    with watch.capture_hf(model, calls.append), torch.no_grad():
        for n in DOCS:  # each document alone, positions from 0
            model(input_ids=ids[:, start:start + n], use_cache=False)
            start += n
    for layer in range(3):
        mine = calls[layer::3]
        q = torch.cat([c.q[0].transpose(0, 1) for c in mine])  # total × H × D, as packed
        k = torch.cat([c.k[0].transpose(0, 1) for c in mine])
        assert_close(stats.values_LMH[layer].double(), per_document(q, k, DOCS, factor=mine[0].factor), rel=1e-5)
    assert stats.rows_LH.unique().tolist() == [sum(DOCS) - len(DOCS)]


class Module(nn.Module):
    is_causal = True


def _flat_qk(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, sum(DOCS), 8, generator=g), torch.randn(1, 2, sum(DOCS), 8, generator=g)


@pytest.mark.parametrize("how", ["cu_seq_lens", "position_ids", "two-rows"])
def test_the_flash_path_cuts_documents_where_transformers_does(how):
    from attnscale.capture.hf import hf_call

    q, k = _flat_qk(7)
    cu = torch.tensor([0, 5, 14, 21], dtype=torch.int32)
    sink = torch.tensor([0.5, -1.0, 1.0, 3.0])
    kwargs = {"scaling": 0.3, "s_aux": sink}
    if how == "cu_seq_lens":
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    elif how == "position_ids":
        kwargs.update(position_ids=_positions())
    else:  # transformers flattens the batch: 2 rows of 21 tokens cut into six documents
        q, k = torch.cat([q, q.flip(2)]), torch.cat([k, k.flip(2)])
        cu2 = torch.cat([cu, cu[1:] + 21])
        kwargs.update(cu_seq_lens_q=cu2, cu_seq_lens_k=cu2, max_length_q=9, max_length_k=9)
    call = hf_call(Module(), "flash_attention_2", q, k, None, kwargs)
    flat = [x.transpose(1, 2).reshape(-1, x.shape[1], 8) for x in (q, k)]  # total × heads × D
    docs = DOCS * 2 if how == "two-rows" else DOCS
    assert_close(reduce_call(call, memory=1).measures(),
                 per_document(*flat, docs, factor=0.3, sink_H=sink))
    # with a padding mask transformers unpads instead: the mask is read, no documents
    assert hf_call(Module(), "flash_attention_2", q, k, torch.ones(q.shape[0], 21), kwargs).mask_mod is None


# ---- packed documents the model lets see each other: one warning ------------------------------------------


def _flattened():
    """Three documents as transformers' DataCollatorWithFlattening packs them: one row, position_ids restarting."""
    g = torch.Generator().manual_seed(8)
    docs = [torch.randint(1, 120, (n,), generator=g).tolist() for n in DOCS]
    batch = transformers.DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": d} for d in docs])
    assert batch["position_ids"].tolist() == [list(range(5)) + list(range(9)) + list(range(7))]
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}


def _packed_warnings(model, batch, probes=1, action="always"):
    from attnscale.capture.packed import PackedDocumentsWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for _ in range(probes):
            watch.measure_heads(model, batch)
    return [w for w in caught if issubclass(w.category, PackedDocumentsWarning)]


def test_documents_that_see_each_other_warn_once_with_the_cause_and_the_fix():
    from test_capture_calls import llama

    model = llama()
    packed = _flattened()
    last = slice(14, 21)  # the third document's tokens
    with torch.no_grad():  # transformers itself: with its default cache, the documents see each other
        alone = model(input_ids=packed["input_ids"][:, last]).last_hidden_state
        crossed = model(**packed).last_hidden_state[:, last]
        apart = model(**packed, use_cache=False).last_hidden_state[:, last]
    assert (crossed - alone).abs().max() > 0.1 and torch.allclose(apart, alone, atol=1e-5)
    [one] = _packed_warnings(model, packed)  # one a forward, though each of the 3 layers crosses
    text = str(one.message)
    assert "'layers.0.self_attn'" in text and "LlamaModel" in text
    assert "use_cache=False" in text and "flash_attention_2" in text
    # under Python's default filter, probe after probe (a watch's steps) show it once
    assert len(_packed_warnings(model, packed, probes=3, action="default")) == 1
    # kept apart: no warning
    assert _packed_warnings(model, {**packed, "use_cache": False}) == []
    # one document a row, positions counting up: nothing packed, nothing said
    plain = {"input_ids": packed["input_ids"], "position_ids": torch.arange(sum(DOCS))[None]}
    assert _packed_warnings(model, plain) == []


def test_the_crossing_check_by_hand():
    from attnscale.capture.hf import hf_call
    from attnscale.capture.packed import crossing, documents

    docs = documents(_positions())
    assert docs.tolist() == [[0] * 5 + [1] * 9 + [2] * 7]
    assert documents(torch.arange(6)[None]) is None and documents(torch.tensor([[0, 1, 2], [0, 1, 2]])) is None
    q, k = _flat_qk(9)
    causal = AttentionCall(q, k, is_causal=True)
    assert crossing(causal, docs)  # the second document's first query sees the first document
    same = (docs[0][:, None] == docs[0][None, :]).tril()
    assert not crossing(AttentionCall(q, k, mask=same[None, None]), docs)
    leak = same.clone()
    leak[20, 0] = True  # one query of the last document sees one key of the first
    assert crossing(AttentionCall(q, k, mask=leak[None, None]), docs)
    # transformers' flash path cuts the documents at the position_ids itself: nothing crosses
    flash = hf_call(Module(), "flash_attention_2", q, k, None, {"position_ids": _positions()})
    assert not crossing(flash, docs)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("impl", ["eager", "flex_attention"])
def test_eager_and_flex_cross_documents_with_a_cache_and_not_without(impl, monkeypatch):
    import torch.nn.attention.flex_attention as flex_module
    from test_capture_calls import llama

    monkeypatch.setattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)  # flex unfused, no compile
    model, packed = llama(attn_implementation=impl), _flattened()
    assert len(_packed_warnings(model, packed)) == 1
    assert _packed_warnings(model, {**packed, "use_cache": False}) == []
