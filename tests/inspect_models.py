"""The tiny models and texts the inspect tests share: a two-layer attnscale model at unit init, token ids for it,
two texts, and an ``on_layer`` that keeps the patterns a measurement sees."""

import torch

from attnscale.lm.model import ModelConfig, build_model

TEXTS = [
    "The scale keeps the scores small, so the softmax stays soft and the head can still learn.",
    "Short one.",
]


def tiny_lm(**kw):
    base = {"vocab_size": 50, "context": 32, "d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 16, "init": "unit"}
    return build_model(ModelConfig(**{**base, **kw}), seed=0)


def ids(B=3, T=32):
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))


def collect(store):
    def on_layer(layer, scheme, scores_BHTT, pattern_BHTT):
        if scheme == "model":
            store.setdefault(layer, []).append(pattern_BHTT)

    return on_layer
