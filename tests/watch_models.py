"""A one-layer attnscale model and a batch of token ids for it, what the tests of the watch's and the probe's
options make their watches and probes on; and the two-layer shape the detail and callback tests watch."""

import torch

from attnscale.lm.model import ModelConfig, build_model

CONFIG = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=1, n_heads=2, head_dim=8)
TWO_LAYERS = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8)
IDS = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(0))


def _model():
    return build_model(CONFIG, seed=0)
