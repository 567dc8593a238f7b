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
