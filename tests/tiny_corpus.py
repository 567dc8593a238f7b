"""A tiny corpus for training tests: import ``corpus`` (a module-scoped fixture) and ``V`` from here."""

import pytest
import torch

from attnscale.lm.data import Corpus

V = 7  # its vocabulary


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    """A repeating pattern of ``V`` tokens with noise: learnable in a few steps, never trivial."""
    g = torch.Generator().manual_seed(0)
    base = torch.arange(4000) % V
    ids = torch.where(torch.rand(4000, generator=g) < 0.1, torch.randint(0, V, (4000,), generator=g), base)
    return Corpus(name="tiny", tokenizer="char", vocab_size=V, train=ids[:3000], valid=ids[3000:], sha256="0" * 64)
