"""A head gone NaN or inf shows in the model-wide numbers, and is counted (``attn/nonfinite_heads``); a head that
measured nothing (no row counted) stays an absence. Checked on a tiny model whose last layer's q weight is NaN
or inf (its first layer against a float64 reference written out here), and on tables written by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscale import watch
from attnscale.capture.stats import HeadStats
from attnscale.core.diagnostics import COLLAPSED_WORDS, HEAD_MEASURES
from modded_reference import assert_close, pooled_measures

H, D, T = 4, 8, 9
IDS = torch.randint(0, 30, (2, T), generator=torch.Generator().manual_seed(0))


class Two(nn.Module):
    """Two causal SDPA layers, q and k from their own projections."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(30, H * D)
        self.q = nn.ModuleList([nn.Linear(H * D, H * D) for _ in range(2)])
        self.k = nn.ModuleList([nn.Linear(H * D, H * D) for _ in range(2)])

    def forward(self, idx):
        x = self.emb(idx)
        B = x.shape[0]
        for q, k in zip(self.q, self.k):
            qh, kh = (f(x).view(B, T, H, D).transpose(1, 2) for f in (q, k))
            x = x + F.scaled_dot_product_attention(qh, kh, kh, is_causal=True).transpose(1, 2).reshape(B, T, H * D)
        return x


@torch.no_grad()
def first_layer(model):
    """The first layer's measures by hand, in float64: q = x W_qᵀ + b_q, k likewise, causal softmax."""
    x = model.emb(IDS).double()
    q, k = ((x @ f.weight.double().T + f.bias.double()).view(2, T, H, D).transpose(1, 2)
            for f in (model.q[0], model.k[0]))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    visible = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand_as(scores)
    weights = torch.softmax(scores.masked_fill(~visible, -math.inf), -1)
    return pooled_measures([(scores, weights, visible)])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_layer_with_a_bad_q_weight_shows_in_the_summary_and_is_counted(bad):
    model = Two()
    with torch.no_grad():
        model.q[1].weight.fill_(bad)  # q = x·W is NaN (inf·x of both signs, summed) in every head of layer 1
    stats = watch.measure_heads(model, IDS)
    good = first_layer(model)
    assert_close(stats.values_LMH[0].double(), good)
    assert torch.isnan(stats.values_LMH[1]).all()
    assert stats.rows_LH.tolist() == [[2 * (T - 1)] * H] * 2  # both layers counted their rows: layer 1 is broken
    s = stats.summary()
    # before: the NaN heads were dropped, and the summary read layer 0's numbers alone
    assert math.isnan(s["attn/max_score"]) and math.isnan(s["attn/min_effective_words"])
    assert math.isnan(s["attn/frozen_fraction"])
    assert s["attn/nonfinite_heads"] == 4.0
    assert s["attn/collapsed_heads"] == float((good[2] < COLLAPSED_WORDS).sum())  # of the heads with a value
    assert stats.nonfinite_LH().tolist() == [[False] * H, [True] * H]
    assert watch.measure(model, IDS)["attn/nonfinite_heads"] == 4.0


def test_a_healthy_model_counts_no_nonfinite_head():
    model = Two()
    s = watch.measure_heads(model, IDS).summary()
    good = first_layer(model)
    assert s["attn/nonfinite_heads"] == 0.0
    assert s["attn/max_score"] >= float(good[1].max()) * (1 - 1e-6)  # layer 1's heads join layer 0's


def table(max_score, effective_words, frozen, rows):
    """HeadStats of one layer of three heads from the given per-head values (the other measures 1.0)."""
    values = torch.ones(1, len(HEAD_MEASURES), 3)
    values[0, HEAD_MEASURES.index("max_score")] = torch.tensor(max_score)
    values[0, HEAD_MEASURES.index("effective_words")] = torch.tensor(effective_words)
    values[0, HEAD_MEASURES.index("frozen_fraction")] = torch.tensor(frozen)
    return HeadStats(values, torch.tensor([rows], dtype=torch.float64), HEAD_MEASURES)


def test_by_hand_an_inf_head_a_nan_head_and_an_absent_head():
    # head 2 counted no row: its NaNs are an absence, and the summary is the other two heads'
    s = table([3.0, 5.0, math.nan], [4.0, 1.5, math.nan], [0.0, 0.5, math.nan], [10.0, 30.0, 0.0]).summary()
    assert s == {"attn/max_score": 5.0, "attn/min_effective_words": 1.5, "attn/frozen_fraction": (0.5 * 30) / 40,
                 "attn/collapsed_heads": 1.0, "attn/nonfinite_heads": 0.0}
    # head 1's max |score| is inf (the others finite): the largest is inf, and one head is non-finite
    s = table([3.0, math.inf, 2.0], [4.0, 3.0, 2.5], [0.0, 0.25, 0.0], [10.0, 30.0, 20.0]).summary()
    assert s["attn/max_score"] == math.inf and s["attn/nonfinite_heads"] == 1.0
    assert s["attn/min_effective_words"] == 2.5 and s["attn/frozen_fraction"] == pytest.approx(0.25 * 30 / 60)
    # head 0 counted rows and reads NaN in its weights' measures only: those turn NaN, max_score stays 5
    s = table([5.0, 3.0, 2.0], [math.nan, 3.0, 2.5], [math.nan, 0.0, 0.0], [10.0, 30.0, 20.0]).summary()
    assert s["attn/max_score"] == 5.0 and s["attn/nonfinite_heads"] == 1.0
    assert math.isnan(s["attn/min_effective_words"]) and math.isnan(s["attn/frozen_fraction"])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_an_attnscale_model_with_a_bad_q_weight_reads_non_finite_in_every_place_its_numbers_go(bad, tmp_path):
    """attnscale's own attention hands over the scores it masked with -inf (a broken head's hidden keys NaN):
    a NaN score is no hidden key. Head 0 of layer 1 counts its rows and reads non-finite per head, in the
    summary, in a Watch's record and in the training run's own step measures; the heads beside it keep their
    numbers, as the same model with head 0 healthy gives them."""
    from attnscale.capture.reduce import reduce_scores
    from attnscale.core.hooks import hooked
    from attnscale.lm.model import ModelConfig, build_model
    from attnscale.watch.loop import Watch
    from attnscale.watch.logs.line import read_log
    from attnscale.watch.logs.sinks import JsonlSink

    cfg = ModelConfig(vocab_size=30, context=T, d_model=H * D, n_layers=2, n_heads=H, head_dim=D)
    model = build_model(cfg, seed=0)
    healthy = watch.measure_heads(model, IDS).values_LMH
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[:D].fill_(bad)  # head 0's q rows
    stats = watch.measure_heads(model, IDS)
    assert stats.rows_LH.tolist() == [[2 * (T - 1)] * H] * 2  # causal: every row but the first sees two keys
    assert stats.nonfinite_LH().tolist() == [[False] * H, [True] + [False] * (H - 1)]
    assert torch.equal(stats.values_LMH[1, :, 1:], healthy[1, :, 1:]) and torch.equal(stats.values_LMH[0], healthy[0])
    s = stats.summary()
    assert math.isnan(s["attn/max_score"]) and math.isnan(s["attn/frozen_fraction"])
    assert s["attn/nonfinite_heads"] == 1.0
    with Watch(model, every=1, probe=IDS, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")]) as w:
        numbers = w.step(1)
    assert numbers["attn/nonfinite_heads"] == 1.0 and math.isnan(numbers["attn/max_score"])
    assert read_log(tmp_path / "w.jsonl")[0].summary["attn/nonfinite_heads"] == 1.0
    with torch.no_grad(), hooked(model, "blocks.*.attn.hook_scores") as cache:  # the training run's step measures
        model(IDS)
    sums = reduce_scores(cache["blocks.1.attn.hook_scores"])
    assert sums.rows.tolist() == [2 * (T - 1)] * H
    assert torch.isnan(sums.measures()[2:, 0]).all() and torch.isfinite(sums.measures()[:, 1:]).all()


def test_a_nan_in_multihead_attentions_float_mask_reads_non_finite_not_hidden():
    """torch gives the model's output NaN there; the key is no hidden one (a hidden key is -inf, or at or below
    HIDDEN_AT), and its rows read NaN."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 5)
    mask[3, 1] = math.nan

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]

    assert torch.isnan(Net()(x)).any()
    stats = watch.measure_heads(Net(), x)
    assert stats.rows_LH.tolist() == [[10.0, 10.0]]  # every row of both sequences sees five keys
    assert stats.nonfinite_LH().tolist() == [[True, True]]
    s = stats.summary()
    assert s["attn/nonfinite_heads"] == 2.0 and math.isnan(s["attn/min_effective_words"])


@pytest.mark.parametrize("rows", [False, True], ids=["B×1×1×S", "B×1×T×S"])
def test_a_nan_in_a_float_key_mask_is_a_visible_key_in_every_path(rows):
    """One rule for a NaN in a float mask, whatever its shape and whichever path reads it: the key is visible
    (only -inf or at or below HIDDEN_AT hides one), its score counts in max |score|, spread and QK-Clip's S_max,
    and the rows that see it read NaN weights, as the model's softmax does. A B×1×1×S mask took head_max's
    one-product path, which read the NaN key as hidden (S_max 1.62 where the B×1×T×S mask read 23.7)."""
    from attnscale.capture.call import HIDDEN_AT, AttentionCall
    from attnscale.capture.fused import measure_call
    from attnscale.capture.smax import head_max
    from attnscale.capture.sums import HeadSums

    g = torch.Generator().manual_seed(3)
    B, H_, T_ = 2, 2, 12
    q, k = torch.randn(B, H_, T_, D, generator=g), torch.randn(B, H_, T_, D, generator=g)
    k[0, :, 5] *= 30  # the key under the NaN holds each head's largest |score|
    mask = torch.zeros(B, 1, 1, T_)
    mask[0, ..., 5], mask[1, ..., 9] = math.nan, -math.inf
    if rows:
        mask = mask.expand(B, 1, T_, T_).clone()
    call = AttentionCall(q, k, mask=mask, is_causal=True)
    visible = torch.ones(T_, T_, dtype=torch.bool).tril() & ~(mask <= HIDDEN_AT)
    s = (q.double() @ k.double().mT) * D ** -0.5
    seen = [s[:, h][visible.expand_as(s)[:, h]] for h in range(H_)]
    want_max = torch.stack([v.abs().max() for v in seen])
    want_spread = torch.stack([v.std(unbiased=False) for v in seen])
    assert float(want_max.min()) > 10 * float(s.masked_fill(~visible | mask.isnan(), 0).abs().max())
    torch.testing.assert_close(head_max(call).double(), want_max, rtol=1e-6, atol=0)
    for sample_rows in (None, 7):  # the replay of every row; the sampled probe, the fused route where it may
        sums = HeadSums(H_)
        measure_call(call, sums, sample_rows=sample_rows)
        got = sums.measures()
        if sample_rows is None:  # (sampled, the replay's scores are those of the sampled rows)
            torch.testing.assert_close(got[1], want_max, rtol=1e-6, atol=0)
            torch.testing.assert_close(got[0], want_spread, rtol=1e-5, atol=0)
        assert torch.isnan(got[2:]).all()  # the rows that see the NaN key: NaN weights, every row measure NaN
