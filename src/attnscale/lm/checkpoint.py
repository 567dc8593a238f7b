"""What a training run is known by, and what it leaves to resume from or read back.

``comparable_config``: the part of a run's config that decides its results (a
rerun must match it to keep a finished run or resume a checkpoint);
``Checkpoint``: model, optimiser, batch-generator and (fp16) gradient-scaler
state, saved atomically, loaded on any device; ``save_weights``: a finished run's final weights as
safetensors."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from attnscale.files import atomic_write_bytes, to_jsonable

__all__ = ["comparable_config", "run_config", "Checkpoint", "save_weights"]


# Train settings that change how a run is executed, not what it measures: a sweep
# resumed with another -j (so another thread count), checkpoint interval, device or
# attention path (fused and explicit agree to float tolerance) is still the same run.
_EXECUTION_ONLY = {"train": ("threads", "checkpoint_every", "device", "attention")}
# Train settings added after runs were first recorded, with the value that means what runs did before:
# a config that holds that value compares equal to one written before the setting existed.
_ADDED_LATER = {"train": {"weights": "fp32", "schedule": "cosine", "eval_every": 0}}
_ADDED_LATER["train"].update(z_loss=0.0, beta1=0.9, adam_eps=1e-8, independent_wd=False)  # the warn study's recipe
_ADDED_LATER["train"]["optimizer"] = "adamw"  # Muon beside AdamW came after
# What makes two corpora the same: the text's hash and how it was cut into tokens,
# not the path or name it was read under ("wikitext-2" and its folder are one corpus).
_CORPUS_IDENTITY = ("sha256", "tokenizer", "vocab_size", "train_tokens", "valid_tokens")


def comparable_config(config: Any) -> dict[str, Any]:
    """The part of a training run's config ({"model", "train", "corpus"}) that decides its results:
    what a rerun must match to keep a finished run or resume a checkpoint."""
    cfg = json.loads(json.dumps(to_jsonable(config)))
    model = cfg.get("model")
    if isinstance(model, dict) and model.get("head_dim", 0) is None and model.get("n_heads"):
        model["head_dim"] = model["d_model"] // model["n_heads"]  # written before a config held the number
    for section, keys in _EXECUTION_ONLY.items():
        for key in keys:
            cfg.get(section, {}).pop(key, None)
    for section, defaults in _ADDED_LATER.items():
        for key, before in defaults.items():
            if cfg.get(section, {}).get(key) == before:  # absent: nothing to drop
                cfg.get(section, {}).pop(key, None)
    corpus = cfg.get("corpus")
    if isinstance(corpus, dict) and any(k in corpus for k in _CORPUS_IDENTITY):
        cfg["corpus"] = {k: corpus[k] for k in _CORPUS_IDENTITY if k in corpus}
    return cfg


class _Config(Protocol):
    """A run's ``ModelConfig`` or ``TrainConfig``: any dataclass instance. A protocol, not those
    classes, because ``lm.train`` imports this module: naming its type here would close a circle."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


def run_config(model_cfg: _Config, train_cfg: _Config, corpus) -> dict[str, Any]:
    """The configuration a training run is known by: {"model", "train", "corpus"} as plain JSON values."""
    return to_jsonable({"model": asdict(model_cfg), "train": asdict(train_cfg), "corpus": corpus.describe()})


class Checkpoint:
    """Model, optimiser, batch-generator and gradient-scaler state and what was recorded, for resuming a run.

    The fp16 scaler's state (its loss scale and growth tracker) travels with the rest: a
    resumed run that restarted at 2**16 would skip other steps than an uninterrupted one."""

    def __init__(self, path: Path, config: dict[str, Any]):
        self.path, self.config = path, config

    def load(self) -> tuple[dict[str, Any] | None, str | None]:
        """The saved state, or None and why it was not used (None when there was nothing to use)."""
        if not self.path.exists():
            return None, None
        try:
            # data only: a pickled object in a checkpoint is refused, never run (the state is tensors and plain values)
            state = torch.load(self.path, weights_only=True, map_location="cpu")
        except Exception as e:  # a torn or foreign file must not fail the run, but it must be said
            return None, (f"{self.path.name} could not be read ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else 'no detail'}); "
                          "trained from step 0")
        if not isinstance(state, dict) or comparable_config(state.get("config")) != comparable_config(self.config):
            return None, f"{self.path.name} belongs to another configuration; trained from step 0"
        return state, None

    def save(self, **state) -> None:
        buffer = io.BytesIO()
        torch.save({"config": self.config, **state}, buffer)
        atomic_write_bytes(self.path, buffer.getvalue())  # a reader sees the old checkpoint or the new one

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """The model's state_dict as safetensors, atomically (tied tensors stored once each, as copies)."""
    from safetensors.torch import save

    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    atomic_write_bytes(Path(path), save(tensors, metadata={"format": "pt"}))
