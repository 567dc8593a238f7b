"""The rule for rows that see one key (``capture.rows``), by every path against float64 written out here.

A row that sees one key puts weight 1 on it whatever its score: it is left out of max |score|, QK-Clip's
S_max and the row measures, and spread keeps every visible score. The case: token 0 scoring itself far above
every other score (as layer 10 head 8 of SmolLM2-135M does: 11.33 against 8.22 without it), and a padded batch
whose second sequence's row 1 sees one real key."""

import math

import pytest
import torch

from attnscale.capture import smax
from attnscale.capture.call import AttentionCall
from attnscale.capture.fused import measure_call
from attnscale.capture.reduce import reduce_call, reduce_scores
from attnscale.capture.smax import head_max
from attnscale.capture.sums import HeadSums

B, H, T, D = 2, 4, 24, 8
PAD = torch.ones(B, T, dtype=torch.bool)
PAD[1, 0] = False  # the second sequence's first token is padding: its row 1 sees one real key


def _qk():
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    q[:, :, 0] = 20 * k[:, :, 0]  # token 0's self-score: the largest of every head, by far
    q[1, :, 1] = 4 * k[1, :, 1]  # and the padded sequence's row 1 on its own (only) key
    return q, k


def _reference(q, k, visible):
    """(spread over every visible score, largest |score| over the rows that see two keys) per head, float64."""
    s = (q.double() @ k.double().mT) * D ** -0.5
    visible = visible.expand_as(s)
    two = visible & (visible.sum(-1, keepdim=True) >= 2)
    spread = torch.stack([s[:, h][visible[:, h]].std(unbiased=False) for h in range(H)])
    return spread, s.abs().masked_fill(~two, 0).amax((0, 2, 3)), s.abs().masked_fill(~visible, 0).amax((0, 2, 3))


CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()
CASES = {  # the call, the padding handed to the probe, which keys each row sees
    "causal": (lambda q, k: AttentionCall(q, k, is_causal=True), None, CAUSAL),
    "causal, padded": (lambda q, k: AttentionCall(q, k, is_causal=True), PAD,
                       CAUSAL & PAD[:, None, None, :] & PAD[:, None, :, None]),
    "causal, key mask": (lambda q, k: AttentionCall(q, k, mask=PAD[:, None, None, :], is_causal=True), None,
                         CAUSAL & PAD[:, None, None, :]),
    "a mask with rows": (lambda q, k: AttentionCall(q, k, mask=torch.where(CAUSAL, 0.0, -math.inf).expand(B, 1, T, T)),
                         None, CAUSAL),
}


@pytest.mark.parametrize("case", list(CASES))
def test_max_score_leaves_out_rows_that_see_one_key_and_spread_keeps_them_by_the_replay_and_the_fused_route(case):
    make, pad, visible = CASES[case]
    q, k = _qk()
    spread, top, raw = _reference(q, k, visible)
    assert bool((raw > 2 * top).all())  # the one-key rows' scores would be every head's largest
    for sample_rows in (None, T - 1):  # the replay of every row; the sampled probe (fused where it may)
        sums = HeadSums(H)
        measure_call(make(q, k), sums, padding_BT=pad, sample_rows=sample_rows)
        got = sums.measures()
        torch.testing.assert_close(got[1], top, rtol=1e-6, atol=0)
        if sample_rows is None:
            torch.testing.assert_close(got[0], spread, rtol=1e-5, atol=0)


@pytest.mark.parametrize("screen", [False, True])
@pytest.mark.parametrize("memory", [256 << 20, 4096])  # one product; blocks of rows
@pytest.mark.parametrize("case", list(CASES))
def test_qk_clips_s_max_leaves_out_rows_that_see_one_key(case, memory, screen, monkeypatch):
    """Every route of head_max: one product (contiguous q and k, and q and k as a model lays them out), blocks,
    the bfloat16 screen, the general blocks (a mask with rows)."""
    monkeypatch.setattr(smax, "SCREEN", screen)
    monkeypatch.setattr(smax, "SCREEN_FROM", 0)
    make, pad, visible = CASES[case]
    q, k = _qk()
    _, top, _ = _reference(q, k, visible)
    strided = (q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2))
    for q_, k_ in ((q, k), strided):
        torch.testing.assert_close(head_max(make(q_, k_), memory, pad).double(), top, rtol=2e-6, atol=0)


def test_scores_a_model_computed_itself_leave_out_rows_that_see_one_key():
    q, k = _qk()
    s = ((q @ k.mT) * D ** -0.5).masked_fill(~CAUSAL, -math.inf)
    spread, top, _ = _reference(q, k, CAUSAL)
    got = reduce_scores(s).measures()
    torch.testing.assert_close(got[1], top, rtol=1e-6, atol=0)
    torch.testing.assert_close(got[0], spread, rtol=1e-5, atol=0)


def test_a_call_whose_every_row_sees_one_key_has_no_max_score_and_nothing_to_clip():
    q, k = _qk()
    call = AttentionCall(q, k, is_causal=True, window=1)
    got = reduce_call(call).measures()
    assert torch.isfinite(got[0]).all() and torch.isnan(got[1:]).all()
    assert head_max(call).tolist() == [0.0] * H
