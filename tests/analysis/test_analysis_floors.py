"""The counted no-attention floors: add-one unigram and bigram perplexity, checked against counts by hand."""

import math

import pytest
import torch

from attnscale.analysis.floors import ngram_floors


def test_the_floors_on_a_tiny_text_counted_by_hand():
    # training "a b a b c a" (ids 0 1 0 1 2 0), V = 3; held-out "a b c c"
    train, valid = torch.tensor([0, 1, 0, 1, 2, 0]), torch.tensor([0, 1, 2, 2])
    got = ngram_floors(train, valid, 3)
    # unigram: c(a) 3, c(b) 2, c(c) 1 of N 6 -> (c + 1) / 9 = 4/9, 3/9, 2/9; held-out a b c c
    uni = math.exp(-(math.log(4 / 9) + math.log(3 / 9) + 2 * math.log(2 / 9)) / 4)
    # bigrams: ab ×2, ba, bc, ca; starting with a: 2, b: 2, c: 1 -> p(w | u) = (c(u w) + 1) / (c(u ·) + 3)
    # held-out pairs a→b (2+1)/(2+3), b→c (1+1)/(2+3), c→c (0+1)/(1+3), never seen
    bi = math.exp(-(math.log(3 / 5) + math.log(2 / 5) + math.log(1 / 4)) / 3)
    assert got["unigram_ppl"] == pytest.approx(uni, rel=1e-12)
    assert got["bigram_ppl"] == pytest.approx(bi, rel=1e-12)
    assert "add-one" in got["smoothing"]


def test_a_token_never_seen_in_training_still_has_a_probability():
    got = ngram_floors(torch.tensor([0, 0, 0]), torch.tensor([0, 2]), 3)
    # unigram: a 4/6, c 1/6; bigram a→c (0 + 1) / (2 + 3)
    assert got["unigram_ppl"] == pytest.approx(math.exp(-(math.log(4 / 6) + math.log(1 / 6)) / 2))
    assert got["bigram_ppl"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="at least two"):
        ngram_floors(torch.tensor([0]), torch.tensor([0, 1]), 2)
