"""Sink and previous-token heads read from one call a block of rows at a time (``capture.kinds``), checked against
the weights computed whole in float64, under a causal mask, padding, a sink logit, GQA and blocks of one row."""

import math

import pytest
import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.kinds import call_kinds
from attnscale.core.head_kinds import kinds_of

T, D = 12, 8


def _planted(B=2, H=4):
    """Head 0 a sink (every query meets key 0 alone), head 1 a previous-token head (query i meets key i - 1),
    heads 2 and 3 random scores."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    q[:, :2], k[:, :2] = 0.0, 0.0
    q[:, 0, :, 0], k[:, 0, 0, 0] = 10.0, 10.0
    for i in range(T):
        q[:, 1, i, (i - 1) % D] = 30.0
        k[:, 1, i, i % D] = 1.0
    return q, k


def _by_hand(q, k, visible_BTS, sink=None, scale=None):
    """The same sums from the weights whole, in float64: softmax over the visible keys (and the sink), the first
    visible key's weight and key i - 1's, over rows that see two keys or more."""
    B, H, _, Dq = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    z = (q.double() @ k.double().mT) * (scale if scale is not None else 1 / math.sqrt(Dq))
    vis = visible_BTS[:, None].expand(B, H, T, T)
    z = z.masked_fill(~vis, -math.inf)
    if sink is not None:
        z = torch.cat([z, sink.double().view(1, H, 1, 1).expand(B, H, T, 1)], -1)
    p = torch.softmax(z, -1)[..., :T]
    out = torch.zeros(3, H, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                seen = vis[b, h, i].nonzero().flatten().tolist()
                if len(seen) < 2:
                    continue
                out[0, h] += p[b, h, i, seen[0]]
                out[1, h] += p[b, h, i, i - 1] if i >= 1 and vis[b, h, i, i - 1] else 0.0
                out[2, h] += 1
    return out


def test_a_causal_call_read_in_blocks_of_one_row_is_the_weights_whole():
    q, k = _planted()
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(2, T, T)
    for memory in (1, 1 << 20):  # one row a block, and the whole call at once
        got = call_kinds(AttentionCall(q, k, is_causal=True), memory=memory)
        assert torch.allclose(got, _by_hand(q, k, causal), atol=1e-5)
    assert kinds_of(got)[:2] == ["sink", "previous"]


def test_padding_a_sink_logit_and_gqa():
    q, k = _planted(H=4)
    k = k[:, ::2].clone()  # 2 key heads, each read by 2 query heads (repeat_kv's order)
    k[:, 0, 0, 0] = 10.0
    pad = torch.ones(2, T, dtype=torch.bool)
    pad[1, :3] = False  # left padding in the second sequence: neither a row nor a key
    sink = torch.tensor([0.0, 5.0, -2.0, 1.0])
    visible = torch.ones(T, T, dtype=torch.bool).tril() & pad[:, None, :] & pad[:, :, None]
    got = call_kinds(AttentionCall(q, k, is_causal=True, sink=sink), padding_BT=pad, memory=1)
    assert torch.allclose(got, _by_hand(q, k, visible, sink=sink), atol=1e-5)
    assert got[2, 0] == (T - 1) + (T - 3 - 1)  # rows that see two keys: 11 in the first sequence, 8 in the second


def test_a_boolean_mask_and_a_head_that_spreads_is_neither():
    q, k = torch.zeros(1, 2, T, D), torch.zeros(1, 2, T, D)  # every score 0: uniform weights
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    got = call_kinds(AttentionCall(q, k, mask=mask.view(1, 1, T, T)))
    assert torch.allclose(got, _by_hand(q, k, mask.expand(1, T, T)), atol=1e-9)
    assert kinds_of(got) == ["", ""]  # row i puts 1/(i+1) on key 0 and on key i - 1: a mean under a half
    assert kinds_of(torch.zeros(3, 2, dtype=torch.float64)) == ["", ""]  # no row counted: no kind
