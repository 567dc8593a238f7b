"""A finished run's folder, built for tests that read one (inspect, the frozen share by threshold)."""

from dataclasses import asdict

import safetensors.torch as safetensors_torch

from attnscale.lm.model import ModelConfig, build_model
from attnscale.runs import record


def _cfg(vocab_size=50, **kw):
    return ModelConfig(**{"vocab_size": vocab_size, "context": 32, "d_model": 32, "n_layers": 2, "n_heads": 4,
                          "head_dim": 16, "init": "unit", **kw})


def _run_dir(path, cfg, *, corpus=None, seed=1, tie=False):
    """A run folder as a finished run leaves it: record.json and model.safetensors."""
    model = build_model(cfg, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    config = {"model": asdict(cfg)}
    if corpus is not None:
        config["corpus"] = corpus.describe()
    record.write(path, record.new("train", config, None, status="done"))
    state = model.state_dict()
    if tie:  # safetensors refuses two names for one tensor: keep one, as save_model does
        state.pop("head.weight")
    safetensors_torch.save_file(state, path / "model.safetensors")
    return model
