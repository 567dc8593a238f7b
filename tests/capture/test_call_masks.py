"""Every path that reads a mask (boolean, additive, a flex score_mod, a flex BlockMask), at each fill value in
use and exactly at the hiding line ``HIDDEN_AT``: a key whose additive mask, or whose score_mod's change to
its score, is -10,000 or below (or -inf) is hidden; one just above the line is a visible key with a bias.

The reference is the definition, written out here in float64: per head the population spread over the visible
scores, the largest |score| over those of the rows that see two or more keys, and over those rows the softmax of score + bias
over the visible keys, its effective words, largest weight, frozen share and push."""

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from attnscale.capture.call import HIDDEN_AT, AttentionCall
from attnscale.capture.flex import flex_call
from attnscale.capture.reduce import dense, reduce_call

B, H, T, D_ = 2, 3, 6, 4
FUTURE = ~torch.ones(T, T, dtype=torch.bool).tril()  # the keys a causal row does not see
FILLS = [HIDDEN_AT, -1e9, torch.finfo(torch.float32).min, -math.inf]  # the line itself, hand-written, transformers, -inf


def _qk(seed=0):
    """Small whole numbers: every score, and every score plus or minus 10,000, is exact in float32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (B, H, T, D_), generator=g).float(), torch.randint(-2, 3, (B, H, T, D_), generator=g).float()


def _reference(q, k, visible, bias=None, threshold=0.99):
    """(6, H) float64 in ``HEAD_MEASURES`` order, from the definitions."""
    s = (q.double() @ k.double().transpose(-2, -1)) * D_ ** -0.5
    visible = visible.expand_as(s)
    logits = s if bias is None else s + bias.double()
    out = []
    for h in range(H):
        vals = s[:, h][visible[:, h]]
        m = float(vals.mean())
        spread = math.sqrt(float(((vals - m) ** 2).mean()))
        rows = []
        for b in range(B):
            for i in range(T):
                seen = visible[b, h, i]
                if int(seen.sum()) < 2:
                    continue
                z = logits[b, h, i][seen]
                p = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
                ent = -float((p * torch.log(p.clamp_min(1e-300))).sum())
                jac = torch.diag(p) - p[:, None] * p[None, :]
                rows.append((math.exp(ent), float(p.max() > threshold), float(jac.pow(2).sum().sqrt()), float(p.max())))
        means = [sum(r[j] for r in rows) / len(rows) for j in range(4)]
        two = visible[:, h] & (visible[:, h].sum(-1, keepdim=True) >= 2)  # max |score|: rows that see two keys
        out.append([spread, float(s[:, h][two].abs().max()), *means])
    return torch.tensor(out, dtype=torch.float64).T


def _check(call, visible, bias=None):
    want = _reference(call.q, call.k, visible, bias)
    for memory in (1, 256 << 20):  # a row of one head at a time, and the whole call at once
        got = reduce_call(call, memory=memory).measures()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)
    return got


@pytest.mark.parametrize("fill", FILLS)
def test_an_additive_mask_hides_a_key_at_every_fill_in_use_and_exactly_at_the_line(fill):
    q, k = _qk()
    mask = torch.zeros(T, T).masked_fill(FUTURE, fill)
    call = AttentionCall(q, k, mask=mask)
    assert torch.equal(call.visible().expand(B, H, T, T), (~FUTURE).expand(B, H, T, T))
    assert not call.has_bias() and call.bias_rows() is None
    _check(call, ~FUTURE)
    assert reduce_call(call).bias_range().isnan().all()  # no bias: the fill is no bias
    logits, weights = dense(call)
    assert torch.isneginf(logits[..., FUTURE]).all() and (weights[..., FUTURE] == 0).all()


def test_an_additive_value_just_above_the_line_is_a_bias_on_a_visible_key():
    q, k = _qk()
    above = HIDDEN_AT + 1  # -9,999: a key the weights all but ignore, whose score still counts
    mask = torch.zeros(T, T).masked_fill(FUTURE, above)
    call = AttentionCall(q, k, mask=mask)
    every = torch.ones(T, T, dtype=torch.bool)
    assert torch.equal(call.visible().expand(B, H, T, T), every.expand(B, H, T, T))
    assert call.has_bias()
    _check(call, every, bias=mask)
    lo, hi = reduce_call(call).bias_range()
    assert lo.tolist() == [above] * H and hi.tolist() == [0.0] * H


def test_a_boolean_mask_hides_what_it_says():
    q, k = _qk(1)
    call = AttentionCall(q, k, mask=~FUTURE)
    assert not call.has_bias()
    _check(call, ~FUTURE)
    _check(AttentionCall(q, k, is_causal=True), ~FUTURE)


def _adding(fill):
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= q_idx, score, score + fill)
    return score_mod


def _filling(fill):
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= q_idx, score, torch.full_like(score, fill))
    return score_mod


@pytest.mark.parametrize("fill", FILLS)
def test_a_score_mod_that_adds_the_fill_hides_the_key_exactly_at_the_line(fill):
    q, k = _qk(2)
    got = _check(AttentionCall(q, k, score_mod=_adding(fill)), ~FUTURE)
    assert float(got[3].max()) < 1  # not every row frozen: the reference reads real weights


def test_a_score_mod_that_adds_just_above_the_line_leaves_a_visible_key_with_a_bias():
    q, k = _qk(2)
    call = AttentionCall(q, k, score_mod=_adding(HIDDEN_AT + 1))
    bias = torch.zeros(T, T).masked_fill(FUTURE, HIDDEN_AT + 1)
    _check(call, torch.ones(T, T, dtype=torch.bool), bias=bias)
    lo, hi = reduce_call(call).bias_range()
    assert lo.tolist() == [HIDDEN_AT + 1] * H and hi.tolist() == [0.0] * H


@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min, -math.inf])
def test_a_score_mod_that_writes_the_fill_in_place_of_the_score_hides_the_key(fill):
    q, k = _qk(3)
    call = AttentionCall(q, k, score_mod=_filling(fill))
    _check(call, ~FUTURE)
    logits, weights = dense(call)
    assert torch.isneginf(logits[..., FUTURE]).all() and (weights[..., FUTURE] == 0).all()


@pytest.mark.parametrize("block", [2, 4])
def test_a_block_mask_hides_the_keys_its_blocks_and_mask_mod_leave_out(block):
    """A causal BlockMask of blocks smaller than the sequence: some blocks full, some partial, some left out."""
    q, k = _qk(4)
    bm = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, T, T, device="cpu",
                           BLOCK_SIZE=block)
    call = flex_call(q, k, block_mask=bm)
    assert torch.equal(call.visible().expand(B, H, T, T), (~FUTURE).expand(B, H, T, T))
    _check(call, ~FUTURE)
    window = create_block_mask(lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) & (q_idx - kv_idx < 3), None, None, T, T,
                               device="cpu", BLOCK_SIZE=block)
    seen = torch.ones(T, T, dtype=torch.bool).tril() & ~torch.ones(T, T, dtype=torch.bool).tril(-3)
    _check(flex_call(q, k, block_mask=window), seen)
