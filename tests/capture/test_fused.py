"""capture.fused: the probe's fused route against a float64 softmax written out here, and against the replay.

The reference makes every score in float64 from the call's q and k, hides keys by the mask built by hand,
and reads each row's entropy as -Σ p log p (0 log 0 = 0) of its float64 softmax; nothing of
``capture.reduce`` or ``capture.sums``."""

import math

import pytest
import torch

from attnscale.capture import fused
from attnscale.capture.call import AttentionCall
from attnscale.capture.fused import measure_call
from attnscale.capture.reduce import reduce_call
from attnscale.capture.sums import HeadSums

B, H, T, D_ = 2, 4, 29, 16
PAD = torch.ones(B, T, dtype=torch.bool)
PAD[1, 21:] = False  # the second sequence's last 8 tokens are padding


def _qk(seed, K=H, sharp=1.0, S=T):
    g = torch.Generator().manual_seed(seed)
    return sharp * torch.randn(B, H, T, D_, generator=g), torch.randn(B, K, S, D_, generator=g)


def _visible(T_, S, causal=False, diagonal=0, window=None, pad=None):
    """B×1×T×S boolean, by the rules written out: j <= i + diagonal, within ``window``, real rows and keys."""
    i, j = torch.arange(T_)[:, None] + diagonal, torch.arange(S)[None, :]
    v = (j <= i) if causal else torch.ones(T_, S, dtype=torch.bool)
    if window is not None:
        v = v & (i - j < window)
    v = v[None, None].expand(B, 1, T_, S)
    if pad is not None:
        v = v & pad[:, None, None, :S] & pad[:, None, :T_, None]
    return v


def _reference(q, k, factor, visible, sink=None):
    """Per head (spread, max |score|, mean effective words over the rows that see two keys) in float64, and each
    row's effective words and max weight (B×H×T), from the definitions."""
    G = q.shape[1] // k.shape[1]
    f = torch.as_tensor(factor, dtype=torch.float64).reshape(-1, 1, 1) if torch.is_tensor(factor) else factor
    s = (q.double() @ k.double().repeat_interleave(G, 1).mT) * f
    vis = visible.expand_as(s)
    z = s.masked_fill(~vis, -math.inf)
    if sink is not None:
        col = sink.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.cat([z, col], -1).softmax(-1)[..., :-1]
    else:
        p = z.softmax(-1)
    words = (-torch.where(p > 0, p * p.log(), 0.0).sum(-1)).exp()
    counted = vis.sum(-1) >= 2
    out = []
    for h in range(s.shape[1]):
        vals = s[:, h][vis[:, h]]
        out.append([float(vals.std(unbiased=False)), float(vals.abs().max()), float(words[:, h][counted[:, h]].mean())])
    return torch.tensor(out, dtype=torch.float64).T, words, p.nan_to_num(0.0).amax(-1), counted


def _fused(call, pad=None, sample_rows=T - 3, memory=256 << 20):
    sums = HeadSums(call.heads)
    method = measure_call(call, sums, padding_BT=pad, sample_rows=sample_rows, memory=memory)
    return method, sums


CASES = {
    "causal": (dict(is_causal=True), dict(causal=True)),
    "no mask": (dict(), dict()),
    "window": (dict(is_causal=True, window=6), dict(causal=True, window=6)),
    "bottom right, fewer keys": (dict(is_causal=True, diagonal=-5), dict(causal=True, diagonal=-5)),
    "causal, padded": (dict(is_causal=True), dict(causal=True, pad=PAD)),
    "window, padded": (dict(is_causal=True, window=6), dict(causal=True, window=6, pad=PAD)),
}


@pytest.mark.parametrize("memory", [256 << 20, 1])  # one block; a row of a head at a time
@pytest.mark.parametrize("case", list(CASES))
def test_every_row_of_every_stack_against_the_float64_softmax(case, memory):
    made, rule = CASES[case]
    q, k = _qk(len(case), K=2)  # GQA: two query heads a key head
    pad = rule.get("pad")
    method, sums = _fused(AttentionCall(q, k, **made), pad, memory=memory)
    want, _, _, _ = _reference(q, k, D_ ** -0.5, _visible(T, T, **rule))
    got = sums.measures()[:3]
    assert method == "fused"
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_a_key_padding_mask_a_sink_and_a_factor_per_head():
    q, k = _qk(3)
    sink = torch.tensor([0.0, 2.0, -1.0, 6.0])  # the last takes most of every row's weight
    factor = torch.tensor([0.1, 0.25, 0.5, 1.0]).view(1, H, 1, 1)
    keys = PAD[:, None, None, :]  # SDPA's boolean key padding mask, B×1×1×S
    method, sums = _fused(AttentionCall(q, k, scale=factor, mask=keys, is_causal=True, sink=sink))
    want, _, _, _ = _reference(q, k, factor.flatten(), _visible(T, T, causal=True) & keys, sink)
    assert method == "fused"
    torch.testing.assert_close(sums.measures()[:3], want, rtol=1e-6, atol=0)


def test_frozen_rows_at_scores_of_ten_thousand_keep_effective_words_to_a_thousandth():
    """Scores up to about 1e4, nearly every row frozen: effective words stay within 2e-7 × the largest |score|
    of the float64 softmax's, row by row (the rows past ``LSE_TOLERANCE`` replayed, the rest from the fp32
    log-sum-exp), against the thresholds read: a collapsed head under 2 words, a frozen row over 0.99."""
    q, k = _qk(7, sharp=2000.0)
    call = AttentionCall(q, k, is_causal=True)
    want, words, top, counted = _reference(q, k, D_ ** -0.5, _visible(T, T, causal=True))
    assert 3e3 < float(want[1].max()) < 2e4 and float((top[counted] > 0.99).double().mean()) > 0.9
    got, rows = fused._effective_words(call, *fused.qualifies(call, None), 256 << 20)
    assert torch.equal(rows, counted.expand_as(rows))
    err = (got - words)[counted].abs()
    assert float(err.max()) < 2e-7 * float(want[1].max())
    method, sums = _fused(call)
    torch.testing.assert_close(sums.measures()[2], want[2], rtol=0, atol=2e-7 * float(want[1].max()))


def _frozen(score, seed=0):
    """q = k (each row's own key its top score, at about ``score``): every row of every head frozen."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, T, D_, generator=g)
    k = k / k.norm(dim=-1, keepdim=True) * (1 + torch.rand(B, H, T, 1, generator=g))  # norms within [1, 2]
    k = k * math.sqrt(score / 4 / D_ ** -0.5)
    return k.clone(), k


@pytest.mark.parametrize("score", [1e3, 1e5, 1e6, 1e7, 1e8])
@pytest.mark.parametrize("case", ["causal, padded", "window, padded"])
def test_a_frozen_head_reads_one_word_at_any_score(case, score):
    """The float32 lse and o hold a row's entropy to about LSE_ERROR × its scores: at 1e7 a frozen head read
    1.19 words from them, past 2 at 1e8. Rows past ``LSE_TOLERANCE`` are replayed, so a frozen head reads
    within 1% of 1 word at any score, and of the float64 softmax row by row."""
    made, rule = CASES[case]
    q, k = _frozen(score)
    call = AttentionCall(q, k, mask=PAD[:, None, None, :], **made)  # key padding as a mask: ``seen``
    visible = _visible(T, T, **rule)
    want, words, _, counted = _reference(q, k, D_ ** -0.5, visible)
    assert 0.9 * score < float(want[1].max()) < 1.1 * score and float(words[counted].max()) < 1.001
    got, rows = fused._effective_words(call, *fused.qualifies(call, PAD), 256 << 20)
    assert torch.equal(rows, counted.expand_as(rows))
    torch.testing.assert_close(got[rows], words[counted], rtol=0, atol=1e-3)
    method, sums = _fused(call, PAD)
    assert method == "fused"
    torch.testing.assert_close(sums.measures()[2], torch.ones(H, dtype=torch.float64), rtol=0, atol=0.01)


def test_the_rows_left_to_the_log_sum_exp_are_within_its_stated_bound():
    """Rows under ``LSE_TOLERANCE`` keep the fused entropy: each within LSE_ERROR · (r + log n) of the
    float64 softmax's, r = |scale|·‖q‖·max‖k‖ (the bound docs/watch-measured.md states; measured up to 3.7·u·r)."""
    for sharp in (1.0, 30.0, 150.0):
        q, k = _qk(8, sharp=sharp)
        call = AttentionCall(q, k, is_causal=True, window=11)
        _, words, _, counted = _reference(q, k, D_ ** -0.5, _visible(T, T, causal=True, window=11))
        n = _visible(T, T, causal=True, window=11).sum(-1).expand(B, H, T)
        bound = fused._entropy_error(q * D_ ** -0.5, k, n)
        kept = counted & (bound <= fused.LSE_TOLERANCE)
        assert bool(kept.any())
        got, _ = fused._effective_words(call, *fused.qualifies(call, None), 256 << 20)
        assert bool(((got.log() - words.log()).abs()[kept] <= bound[kept]).all())


def test_the_sampled_rows_read_what_the_replay_reads_and_the_rest_reads_every_row():
    q, k = _qk(11, sharp=4.0)
    call = AttentionCall(q, k, is_causal=True)
    method, sums = _fused(call, PAD, sample_rows=9)
    sampled = reduce_call(call, padding_BT=PAD, sample_rows=9)
    whole = reduce_call(call, padding_BT=PAD)
    assert method == "fused"
    assert torch.equal(sums.measures()[3:], sampled.measures()[3:])  # frozen share, push, max weight: the replay's
    assert torch.equal(sums.standard_errors()[1:], sampled.standard_errors()[1:])
    torch.testing.assert_close(sums.measures()[:3], whole.measures()[:3], rtol=1e-6, atol=0)
    assert torch.equal(sums.rows_effective_words, whole.rows_effective_words)  # every row, less padding
    assert torch.equal(sums.rows, sampled.rows)


def _cap(s):
    return 5.0 * torch.tanh(s / 5.0)


REPLAYED = {
    "soft-cap": dict(is_causal=True, softcap=5.0),
    "cap": dict(is_causal=True, cap=_cap),
    "score_mod": dict(score_mod=lambda s, b, h, i, j: s - (i - j).abs().float()),
    "mask_mod": dict(mask_mod=lambda b, h, i, j: (i - j) % 3 == 0),
    "a mask with rows": dict(mask=torch.ones(T, T, dtype=torch.bool).tril()),
    "a bias": dict(is_causal=True, bias=torch.full((1, H, 1, 1), 0.5)),
    "a float mask with a bias in it": dict(mask=torch.zeros(B, 1, 1, T).index_fill_(-1, torch.tensor([3]), 1.5)),
}


@pytest.mark.parametrize("case", list(REPLAYED))
def test_a_call_the_kernel_does_not_compute_as_it_is_is_replayed_and_says_so(case):
    q, k = _qk(5)
    call = AttentionCall(q, k, **REPLAYED[case])
    method, sums = _fused(call, sample_rows=9)
    assert method == "replay"
    assert torch.equal(sums.data, reduce_call(call, sample_rows=9).data)


def test_without_sampled_rows_the_replay_reads_every_row_itself():
    q, k = _qk(2)
    method, sums = _fused(AttentionCall(q, k, is_causal=True), sample_rows=None)
    assert method == "replay"
    assert torch.equal(sums.data, reduce_call(AttentionCall(q, k, is_causal=True)).data)


def test_a_kernel_that_refuses_the_call_leaves_it_to_the_replay(monkeypatch):
    monkeypatch.setattr(fused, "lse_attention", lambda *a: None)
    q, k = _qk(2)
    call = AttentionCall(q, k, is_causal=True)
    method, sums = _fused(call, sample_rows=9)
    assert method == "replay" and torch.equal(sums.data, reduce_call(call, sample_rows=9).data)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_query_reads_non_finite_never_healthy(bad):
    q, k = _qk(4)
    q[0, 2, 17, 3] = bad  # one row of head 2
    method, sums = _fused(AttentionCall(q, k, is_causal=True))
    got = sums.measures()
    assert method == "fused"
    assert torch.isnan(got[[0, 2], 2]).all() and not torch.isfinite(got[1, 2])  # spread, words; max |score|
    assert torch.isfinite(got[:3, [0, 1, 3]]).all()  # the other heads as they are


def test_padding_in_the_keys_never_reaches_a_real_row_even_as_nan():
    q, k = _qk(6)
    k[1, :, 25] = math.nan  # a padded key of the second sequence
    method, sums = _fused(AttentionCall(q, k, is_causal=True), PAD)
    want, _, _, _ = _reference(q, k.nan_to_num(0.0), D_ ** -0.5, _visible(T, T, causal=True, pad=PAD))
    assert method == "fused"
    torch.testing.assert_close(sums.measures()[:3], want, rtol=1e-6, atol=0)
