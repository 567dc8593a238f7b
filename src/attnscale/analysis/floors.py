"""What a model without attention can do on a corpus: the unigram and bigram floors, counted.

A gap between two scales means little until it is set against what attention is worth on the
corpus at all. The counted floors here ask the held-out split how well a model that sees no
context (unigram) or only the token before (bigram) predicts it, with counts taken from the
training split alone.

Smoothing, fixed before any number was looked at: add-one (Laplace) for both,

    p(w) = (c(w) + 1) / (N + V),        p(w | u) = (c(u, w) + 1) / (c(u, ·) + V),

with N the training tokens, V the vocabulary, c(u, ·) the training bigrams that start with u.
Held-out perplexity is exp of the mean negative log-likelihood over the held-out tokens (the
bigram over every held-out token after the first, each given the one before it). Add-one is
the rule with no constant to tune: a tuned interpolation would be tuned on some split, and a
floor must not be fitted to the held-out one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["SMOOTHING", "ngram_floors"]

SMOOTHING = "add-one (Laplace) counts from the training split"


def _ppl(log_p: torch.Tensor) -> float:
    return math.exp(-float(log_p.mean()))


def ngram_floors(train_ids: torch.Tensor, valid_ids: torch.Tensor, vocab_size: int) -> dict[str, Any]:
    """{"unigram_ppl", "bigram_ppl", "smoothing"}: held-out perplexity of the add-one unigram and
    bigram models counted on ``train_ids`` (1-D token ids below ``vocab_size``). The bigram counts
    are kept sparse (the pairs seen), so a word-level vocabulary costs no V × V table."""
    train_ids, valid_ids = train_ids.long().flatten(), valid_ids.long().flatten()
    if len(train_ids) < 2 or len(valid_ids) < 2:
        raise ValueError("the floors need at least two training and two held-out tokens")
    V = vocab_size
    uni = torch.bincount(train_ids, minlength=V).double()
    p_uni = (uni + 1) / (len(train_ids) + V)
    # bigrams: each seen pair u·V + w once, with its count; held-out pairs looked up by binary search
    pairs, counts = torch.unique(train_ids[:-1] * V + train_ids[1:], return_counts=True)
    starts = torch.bincount(train_ids[:-1], minlength=V).double()
    prev, nxt = valid_ids[:-1], valid_ids[1:]
    key = prev * V + nxt
    at = torch.searchsorted(pairs, key).clamp(max=len(pairs) - 1)
    seen = torch.where(pairs[at] == key, counts[at].double(), torch.zeros((), dtype=torch.float64))
    p_bi = (seen + 1) / (starts[prev] + V)
    return {"unigram_ppl": _ppl(p_uni[valid_ids].log()), "bigram_ppl": _ppl(p_bi.log()), "smoothing": SMOOTHING}
