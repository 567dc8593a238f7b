"""A materialised float64 reference for calls whose weights are not softmax(score + bias): a flex_attention
score_mod, an attention sink, several documents pooled. Written from the definitions (DESIGN.md's measures,
the sink as reduce.py's docstring defines it), nothing of ``capture``."""

import math

import torch

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def dense_index(B, H, T, S):
    """(b, h, q_idx, kv_idx) broadcast to B×H×T×S, as flex hands them to a score_mod."""
    return (torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
            torch.arange(T)[None, None, :, None], torch.arange(S)[None, None, None, :])


def scores_of(q_BHTD, k_BKSD, factor):
    """q·kᵀ × factor: the product in float32 (as the model and the capture make it), then float64."""
    H, K = q_BHTD.shape[1], k_BKSD.shape[1]
    k = k_BKSD.float().repeat_interleave(H // K, dim=1)
    return ((q_BHTD.float() @ k.transpose(-2, -1)) * factor).double()


def weights_of(logits, visible, sink_H=None):
    """softmax over the visible keys, a sink's e^z in the denominator where there is one: B×H×T×S float64."""
    logits = logits.masked_fill(~visible, -math.inf)
    if sink_H is not None:
        sink = sink_H.double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        return (logits - torch.cat([logits, sink], -1).logsumexp(-1, keepdim=True)).exp()
    return torch.softmax(logits, -1).nan_to_num(0.0)


def pooled_measures(parts, threshold=0.99):
    """(len(MEASURES), H) float64 over every part's entries and rows together: ``parts`` a list of (scores,
    weights, visible), each B×H×T×S. Spread over the visible entries, max |score| over those of the rows that see
    at least two keys; row measures averaged over the
    rows that see at least two keys, each of the row's weights over its keys: effective words exp(-Σ p log p),
    max weight, frozen where it passes ``threshold``, push sqrt(Σp² - 2Σp³ + (Σp²)²)."""
    H = parts[0][0].shape[1]
    out = torch.full((len(MEASURES), H), math.nan, dtype=torch.float64)
    for h in range(H):
        vals = torch.cat([s[:, h][v.expand_as(s)[:, h]] for s, _, v in parts])
        rows = [p[:, h][v.expand_as(s)[:, h].sum(-1) >= 2].double() for s, p, v in parts]
        width = max(r.shape[-1] for r in rows)  # zero weights, padding a row out, add nothing to a measure
        p = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[-1])) for r in rows])
        out[0, h] = vals.std(unbiased=False)
        two = [s[:, h][v.expand_as(s)[:, h] & (v.expand_as(s)[:, h].sum(-1, keepdim=True) >= 2)] for s, _, v in parts]
        two = torch.cat(two)  # max |score|: the rows that see two keys (one key: weight 1 whatever the score)
        if len(two):
            out[1, h] = two.abs().max()
        if len(p):
            s2, s3 = p.pow(2).sum(-1), p.pow(3).sum(-1)
            mw = p.max(-1).values
            out[2, h] = torch.special.entr(p).sum(-1).exp().mean()
            out[3, h] = (mw > threshold).double().mean()
            out[4, h] = (s2 - 2 * s3 + s2**2).clamp_min(0).sqrt().mean()
            out[5, h] = mw.mean()
    return out


def assert_close(got, want, rel=1e-5):
    """Per measure and head, |got - want| within ``rel`` of |want| (of 1e-12 where want is 0); NaN where want is."""
    got, want = got.double(), want.double()
    assert torch.isnan(got).tolist() == torch.isnan(want).tolist(), (got, want)
    ok = ~torch.isnan(want)
    err = ((got - want).abs() / want.abs().clamp_min(1e-12))[ok]
    assert float(err.max()) < rel, (got, want)


def flash_structure(T, S, causal, window_size):
    """flash-attn's rule, T×S: query i sees keys i + S - T - left … i + S - T + right (causal: right = 0);
    and its ALiBi distance, -|i + S - T - j|."""
    left, right = window_size
    right = 0 if causal else right
    i, j = torch.arange(T)[:, None] + S - T, torch.arange(S)[None, :]
    seen = torch.ones(T, S, dtype=torch.bool)
    if right >= 0:
        seen &= j <= i + right
    if left >= 0:
        seen &= j >= i - left
    return seen, -(i - j).abs().float()


def per_document(q, k, docs, causal=True, slopes=None, factor=None, sink_H=None):
    """The reference of a packed row (q total×H×D, k total×K×D): each document of ``docs`` (lengths) measured
    alone, with its own scores, weights and causal rule, and the rows of all pooled."""
    factor = q.shape[-1] ** -0.5 if factor is None else factor
    parts, start = [], 0
    for n in docs:
        qd, kd = q[start:start + n].transpose(0, 1)[None], k[start:start + n].transpose(0, 1)[None]
        scores = scores_of(qd, kd, factor)
        seen, distance = flash_structure(n, n, causal, (-1, -1))
        logits = scores if slopes is None else scores + (slopes[:, None, None] * distance).double()
        parts.append((scores, weights_of(logits, seen[None, None], sink_H), seen[None, None].expand_as(scores)))
        start += n
    return pooled_measures(parts)
