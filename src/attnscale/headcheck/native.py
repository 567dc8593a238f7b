"""attnscale's own models for ``attnscale inspect``: any module built from
``attnscale.core.attention.Attention`` heads, read through their hook points,
and the TinyLM of a training run: the final weights a finished run keeps
(``model.safetensors`` beside ``record.json``) or the ``checkpoint.pt`` an
interrupted run leaves. A run's text is tokenized with its corpus's tokenizer.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnscale.core.attention import Attention
from attnscale.core.device import to_device
from attnscale.core.scales import ScoreScale
from attnscale.errors import ConfigError
from attnscale.runs import record as run_record
from attnscale.runs.record import Record
from attnscale.capture.call import AttentionCall
from attnscale.capture.own import capture_hooks
from attnscale.headcheck.engine import HeadCheck, InspectConfig, InspectResult, Layer, OnLayer, check_texts, take_sequences

__all__ = ["CHECKPOINT", "WEIGHTS", "inspect", "is_run", "load", "load_checkpoint", "load_run"]

WEIGHTS = run_record.WEIGHTS  # a finished run's final weights: TinyLM's state_dict
CHECKPOINT = run_record.CHECKPOINT  # what an interrupted run leaves to resume from
RECORD = run_record.RECORD
HF_CONFIG = "config.json"  # what makes a folder a Hugging Face model's

Encoder = Callable[[str], Any]


def is_run(path: Path) -> bool:
    """A training checkpoint (any ``.pt`` path) or a folder that holds a run's record or checkpoint; a
    ``model.safetensors`` alone is a run's only beside no ``config.json``, which makes the folder a
    Hugging Face model's (its weights go by the same name)."""
    path = Path(path)
    if path.suffix == ".pt":
        return True
    if not path.is_dir():
        return False
    if (path / RECORD).is_file() or (path / CHECKPOINT).is_file():
        return True
    return (path / WEIGHTS).is_file() and not (path / HF_CONFIG).is_file()


def load(path: Path) -> tuple[nn.Module, Encoder | None]:
    """The TinyLM of a checkpoint or run folder and its corpus's encoder (None
    where the record names no corpus)."""
    path = Path(path)
    return load_checkpoint(path) if path.suffix == ".pt" else load_run(path)


# ---- run folders and checkpoints ---------------------------------------------------------


def _read_record(run_dir: Path) -> Record:
    try:
        return run_record.read(run_dir)
    except run_record.RecordError as e:
        raise ConfigError(f"--model: {e}; give the folder of an attnscale training run") from None


def _model_config_from_run(run_dir: Path):
    """The ModelConfig a run trained, from its record's ``config["model"]``."""
    from attnscale.lm.model import ModelConfig

    config = _read_record(run_dir).config.get("model")
    path = run_dir / RECORD
    if not isinstance(config, dict):
        raise ConfigError(f"--model: {str(path)!r} names no model (config.model); give the folder of one training run, not of a sweep")
    try:
        return ModelConfig(**config)
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"--model: the model config in {str(path)!r} does not build a TinyLM ({e}); give a run of this attnscale version") from None


def _corpus_from_run(run_dir: Path) -> dict[str, Any] | None:
    """What the record says of the corpus (name, tokenizer, sha256), or None."""
    corpus = _read_record(run_dir).config.get("corpus")
    return corpus if isinstance(corpus, dict) else None


def _encoder(corpus: dict[str, Any], source: Path) -> Encoder:
    """The encoder of the corpus a model was trained on, refused if the corpus has changed since."""
    from attnscale.lm.data import load_corpus

    try:
        name, tokenizer, sha256 = corpus["name"], corpus["tokenizer"], corpus["sha256"]
    except (KeyError, TypeError):
        raise ConfigError(f"--model: {str(source)!r} does not say which corpus the model read; give an attnscale training run") from None
    codec = load_corpus(name, tokenizer)
    if codec.sha256 != sha256:
        raise ConfigError(f"--model: the corpus {name!r} has changed since {str(source)!r} was trained; restore it to read text")
    return codec.encode


def _first_line(e: Exception) -> str:
    """The line of an error message that says what happened (torch heads its list with a title)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    return (lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0])[:200]


def _load_weights(model: nn.Module, path: Path) -> None:
    """Load a safetensors state_dict into ``model``, all of it or a ConfigError.
    A tied read-out is one tensor under two names; a file may keep either name or both."""
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:
        raise ConfigError(f"--model: reading {str(path)!r} needs safetensors; install it: pip install safetensors") from None
    fix = f"give a finished run's folder, or train the run again to rewrite {path.name}"
    try:
        state = load_file(path, device="cpu")
    except (OSError, ValueError, SafetensorError) as e:
        raise ConfigError(f"--model: {str(path)!r} is damaged ({_first_line(e)}); {fix}") from None
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise ConfigError(f"--model: {str(path)!r} does not fit the model in its record.json ({_first_line(e)}); {fix}") from None
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded]
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"holds {unexpected[0]!r}, which the model has not"
        raise ConfigError(f"--model: {str(path)!r} {what}: it does not fit the model in its record.json; {fix}")


def _refuse_running(run_dir: Path) -> None:
    """A ``ConfigError`` where the record says the run is still training: its final weights do not exist yet,
    and a checkpoint read silently would pass for them. A record that cannot be read is left to the caller."""
    try:
        status = run_record.read(run_dir).status if (run_dir / RECORD).is_file() else None
    except run_record.RecordError:
        return
    if status != "running":
        return
    checkpoint = run_dir / CHECKPOINT
    latest = (f"its latest checkpoint is {str(checkpoint)!r}: give that to --model to inspect it as it is now"
              if checkpoint.is_file() else "it has saved no checkpoint yet")
    raise ConfigError(f"--model: {str(run_dir)!r} is still training (its record.json says running; a run killed "
                      f"before it ended says so too), so it has no final weights yet; {latest}")


def _refuse_no_weights(run_dir: Path, weights: Path) -> None:
    """Why a run folder holds no final weights, in one ``ConfigError``: a diverged run never keeps them (its
    weights were no longer finite), a run written before runs kept them can be trained again to keep them."""
    record = _read_record(run_dir)
    if record.status == "diverged":
        at = record.results.get("diverged_at") if isinstance(record.results, dict) else None
        raise ConfigError(f"--model: {str(run_dir)!r} diverged{f' at step {at}' if at is not None else ''} "
                          "(its record.json says so), so it has no final weights: a run that diverges keeps "
                          "none; give a run that finished")
    raise ConfigError(f"--model: {str(weights)!r} does not exist: this run kept no final weights; "
                      "train it again with this version of attnscale to keep them")


def load_run(run_dir: Path) -> tuple[nn.Module, Encoder | None]:
    """A run folder's TinyLM: its final weights (``model.safetensors``, built from
    ``record.json``'s model config) or, where the run was interrupted, its ``checkpoint.pt``."""
    from attnscale.lm.model import build_model

    run_dir = Path(run_dir)
    weights = run_dir / WEIGHTS
    if not weights.exists():
        _refuse_running(run_dir)
    if not weights.exists() and (run_dir / CHECKPOINT).is_file():
        return load_checkpoint(run_dir / CHECKPOINT)
    if not (run_dir / RECORD).is_file():
        raise ConfigError(f"--model: {str(run_dir)!r} holds {WEIGHTS} but neither {RECORD} (an attnscale run's) nor "
                          f"{HF_CONFIG} (a Hugging Face model's) to build its model from; give the whole folder of "
                          "either")
    cfg = _model_config_from_run(run_dir)  # a bad record is named before a missing weights file
    if not weights.is_file():
        _refuse_no_weights(run_dir, weights)
    model = build_model(cfg, seed=0)  # a fixed seed: building must not draw from the caller's generator
    _load_weights(model, weights)
    corpus = _corpus_from_run(run_dir)
    return model.eval(), (_encoder(corpus, run_dir) if corpus is not None else None)


def load_checkpoint(path: Path) -> tuple[nn.Module, Encoder]:
    """A TinyLM and its corpus's encoder from a training run's ``checkpoint.pt``."""
    from attnscale.lm.model import ModelConfig, build_model

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--model: {str(path)!r} does not exist; give the checkpoint.pt of an attnscale training run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model(ModelConfig(**state["config"]["model"]), seed=0)
        model.load_state_dict(state["model"])
        corpus = state["config"]["corpus"]
    except (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as e:
        raise ConfigError(f"--model: {str(path)!r} is not an attnscale checkpoint ({type(e).__name__}); "
                          "give the checkpoint.pt of an attnscale training run") from None
    return model.eval(), _encoder(corpus, path)


# ---- measuring -------------------------------------------------------------------------


def _layer(m: Attention) -> Layer:
    custom_cap = type(m.scale).cap is not ScoreScale.cap
    source = f"attnscale scale {m.scale.name!r} with d_k = {m.head_dim}: {(type(m.scale).__doc__ or '').strip().splitlines()[0].rstrip('.')}"
    return Layer(float(m.scale.factor()), m.scale.cap if custom_cap else None, m.n_heads, m.n_heads, m.head_dim,
                 m.causal, source, getattr(m.scale, "cap_value", None), type(m).__name__)


def inspect(model: nn.Module, texts, cfg: InspectConfig, on_layer: OnLayer | None, tokenizer, name: str) -> InspectResult:
    """Measure every ``Attention`` head of ``model`` (see ``check.inspect_model``)."""
    attns = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    if isinstance(texts, torch.Tensor):
        ids = texts.long().reshape(-1, texts.shape[-1]) if texts.ndim > 1 else texts.long()[None]
        rows = ids.tolist()
    elif tokenizer is not None:
        rows = [list(map(int, tokenizer(t))) for t in check_texts(texts)]
    else:
        raise ConfigError("an attnscale model takes token ids; pass a LongTensor, or a tokenizer (e.g. corpus.encode) with the texts")
    context = getattr(getattr(model, "cfg", None), "context", None)
    if context and cfg.max_tokens > context:
        raise ConfigError(f"--max-tokens {cfg.max_tokens} is more than the model's context of {context}; give at most {context}")
    seqs, available = take_sequences([r[i : i + cfg.max_tokens] for r in rows for i in range(0, len(r), cfg.max_tokens)], cfg)
    index = {id(m): i for i, (_, m) in enumerate(attns)}
    check = HeadCheck(cfg, on_layer)

    def on_call(call: AttentionCall) -> None:
        # q and k as the scale prepares them; the keys each row sees as the model sees them (its causal structure)
        T, S = call.q.shape[-2], call.k.shape[-2]
        seen = call.visible()
        mask_B1TS = torch.ones(1, 1, T, S, dtype=torch.bool, device=call.q.device) if seen is None else seen
        check.add(index[id(call.module)], _layer(call.module), call.q, call.k, mask_B1TS)

    # Sequences of one length go together: the attnscale models take no padding mask.
    by_len: dict[int, list[list[int]]] = {}
    for s in seqs:
        by_len.setdefault(len(s), []).append(s)
    device = next(model.parameters()).device  # the ids go where the model is
    with capture_hooks(model, on_call), torch.no_grad():
        for group in by_len.values():
            for start in range(0, len(group), cfg.batch):
                # core.device's copy rule: non-blocking only from pinned memory to CUDA (a fresh
                # unpinned tensor copied non-blocking to MPS can be read after it is freed)
                model(to_device(device, torch.tensor(group[start : start + cfg.batch]))[0])
    return check.result(name, type(model).__name__, seqs, available)
