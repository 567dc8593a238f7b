"""The materialised reference the streaming reduction is tested against: every head measure from whole
B×H×T×S tensors, head by head in float64, written from the definitions (``core.diagnostics``' row rules,
nothing of ``capture.reduce``)."""

import math

import torch

from attnscale.core import diagnostics as D

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def head_measures(scores_BHTT, pattern_BHTT, threshold=0.99):
    """(len(MEASURES), H) float32: spread over the finite scores, max |score| over those of the rows that see at
    least two, the row measures averaged over those rows; NaN where a head has none."""
    scores, pattern = scores_BHTT.detach().cpu().double(), pattern_BHTT.detach().cpu().double()
    out = []
    for h in range(scores.shape[1]):
        s, p = scores[:, h], pattern[:, h]
        keep = torch.isfinite(s)
        vals = s[keep]
        spread = float(vals.std(unbiased=False)) if len(vals) else math.nan
        two = s[keep & (keep.sum(-1, keepdim=True) >= 2)]  # max |score|: the rows that see two keys
        top = float(two.abs().max()) if len(two) else math.nan
        rows = p[(keep.sum(-1) >= 2) & (p.sum(-1) > 0.5)]
        if len(rows):
            mw = rows.max(-1).values
            row = [float(D.effective_words(rows).double().mean()), float((mw > threshold).double().mean()),
                   float(D.push(rows).double().mean()), float(mw.mean())]
        else:
            row = [math.nan] * 4
        out.append([spread, top, *row])
    return torch.tensor(out, dtype=torch.float64).T.float()


def head_summary(scores_BHTT, pattern_BHTT, threshold=0.99):
    """``head_measures`` as {measure: [per head]}."""
    return dict(zip(MEASURES, head_measures(scores_BHTT, pattern_BHTT, threshold).tolist()))


def call_measures(q_BHTD, k_BKSD, factor, visible=None, bias=None, cap=None, threshold=0.99):
    """Every head measure of one attention call from q and k: the score is cap(q·kᵀ × factor) over the
    visible keys (the bias left out), the weights the softmax of score + bias over them. q·kᵀ in float32,
    as the model makes it (and as the capture recomputes it), everything after in float64."""
    H, K = q_BHTD.shape[1], k_BKSD.shape[1]
    k = k_BKSD.float().repeat_interleave(H // K, dim=1)
    s = ((q_BHTD.float() @ k.transpose(-2, -1)) * factor).double()
    s = cap(s) if cap is not None else s
    keep = torch.ones_like(s, dtype=torch.bool) if visible is None else visible.expand_as(s)
    logits = s if bias is None else s + bias.double()
    p = torch.softmax(logits.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0)
    return head_measures(s.masked_fill(~keep, math.inf * -1), p, threshold)
