"""``attnscale inspect`` as a call: pick the adapter that reads the model, measure, write.

Adapters: ``native`` for attnscale models, training checkpoints and run folders;
``hf`` for Hugging Face models (transformers loads only when one is read)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from attnscale.core.attention import Attention
from attnscale.core.device import describe_device, resolve_device
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError
from attnscale.headcheck import hf, native
from attnscale.headcheck.engine import InspectConfig, InspectResult, OnLayer, check_texts

__all__ = ["DEFAULT_TOKENS", "default_max_tokens", "inspect_model", "run", "runs_inside"]

# Where a model says nothing shorter: all-MiniLM-L6-v2 was trained on pieces of 128 tokens,
# and a longer sequence costs T² memory per head on a CPU for little more to read.
DEFAULT_TOKENS = 128
SHOWN_RUNS = 6  # runs named in the error for a folder of runs
HEATMAPS = "heatmaps.png"  # beside the record, with --out


def default_max_tokens(model: nn.Module) -> int:
    """Tokens per sequence when ``max_tokens`` is not given: an attnscale model's
    context (a training run's ``model.context``); a Hugging Face model's
    ``max_position_embeddings``, at most ``DEFAULT_TOKENS``; else ``DEFAULT_TOKENS``."""
    context = getattr(getattr(model, "cfg", None), "context", None)
    if context:
        return int(context)
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(int(positions), DEFAULT_TOKENS) if positions else DEFAULT_TOKENS


def runs_inside(folder: Path, depth: int = 2) -> list[Path]:
    """The training-run folders under ``folder``, down to ``depth`` levels: what
    ``sweep``, ``dynamics``, ``schemes`` and ``study`` write (OUT/<run>) and
    ``reproduce`` (OUT/<stage>/<run>)."""
    found: list[Path] = []
    for d in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
        if native.is_run(d) and ((d / native.WEIGHTS).is_file() or (d / native.CHECKPOINT).is_file()):
            found.append(d)
        elif depth > 1:
            found += runs_inside(d, depth - 1)
    return found


def _refuse_folder_of_runs(path: Path) -> None:
    """A folder that holds runs, not one: name them, and the command that reads the first."""
    if not path.is_dir() or native.is_run(path):
        return
    runs = runs_inside(path)
    if runs:
        named = ", ".join(str(r.relative_to(path)) for r in runs[:SHOWN_RUNS])
        more = f" and {len(runs) - SHOWN_RUNS} more" if len(runs) > SHOWN_RUNS else ""
        raise ConfigError(f"--model: {str(path)!r} holds {len(runs)} training runs, not one ({named}{more}); "
                          f"give one of them, e.g. --model {runs[0]}")


def _sized(cfg: InspectConfig, model: nn.Module) -> InspectConfig:
    return cfg if cfg.max_tokens is not None else dataclasses.replace(cfg, max_tokens=default_max_tokens(model))


def inspect_model(
    model: str | Path | nn.Module,
    texts: str | Sequence[str] | torch.Tensor,
    *,
    tokenizer=None,
    max_tokens: int | None = None,
    batch: int = 8,
    sequences: int | None = 16,
    threshold: float = FROZEN_THRESHOLD,
    what_ifs: tuple[str, ...] = ("none", "inv_d"),
    on_layer: OnLayer | None = None,
    device: str | torch.device | None = None,
) -> InspectResult:
    """Measure every head of ``model`` on ``texts``.

    ``model``: a shortcut, folder or .gguf path of a Hugging Face model (loaded
    offline); an attnscale run folder (its final ``model.safetensors``, or the
    ``checkpoint.pt`` of an interrupted run) or checkpoint file, read with its
    corpus's tokenizer; a loaded Hugging Face model (give its ``tokenizer``); or
    a module holding attnscale ``Attention`` heads (give token ids, or texts and
    a ``tokenizer`` callable). Each text is cut into sequences of at most
    ``max_tokens`` (None: ``default_max_tokens``, the model's context); the first ``sequences`` of them are read, ``batch`` per
    forward pass. ``on_layer(layer, scheme, scores_BHTT, pattern_BHTT)`` sees
    each layer's tensors as they pass (scheme "model" is the model's own scale),
    before they are dropped.

    ``device`` (a spec such as "cuda" or a ``torch.device``): the model is moved there
    and measured there; None leaves a given module where it is and loads a named one
    on the CPU. The numbers equal the CPU's to float tolerance."""
    target = resolve_device(device) if device is not None else None
    name = str(model) if isinstance(model, (str, Path)) else type(model).__name__
    cfg = InspectConfig(name, max_tokens, batch, sequences, threshold, tuple(what_ifs),
                        **({"device": str(target)} if target is not None else {}))
    return _inspect(cfg, model, texts, target, tokenizer, on_layer)


def _inspect(cfg: InspectConfig, model: str | Path | nn.Module, texts, target: torch.device | None,
             tokenizer=None, on_layer: OnLayer | None = None) -> InspectResult:
    """``inspect_model`` once its config is built and its device resolved (``target``; None: where the model is)."""
    name = cfg.model
    if not isinstance(texts, torch.Tensor):
        texts = check_texts(texts)  # before a load that may take half a minute
    if isinstance(model, (str, Path)):
        _refuse_folder_of_runs(Path(model))
    if isinstance(model, (str, Path)) and native.is_run(Path(model)):
        model, encode = native.load(Path(model))
        model = model.to(target) if target is not None else model
        if encode is None and tokenizer is None and not isinstance(texts, torch.Tensor):
            raise ConfigError(f"--model: the record of {name!r} names no corpus (config.corpus) to turn text into tokens; "
                              "give a run whose record names its corpus, or token ids from Python")
        return native.inspect(model, texts, _sized(cfg, model), on_layer, tokenizer or encode, name)
    if isinstance(model, (str, Path)):
        loaded = hf.load(name)
        if target is not None:
            loaded.model.to(target)
        return hf.inspect(loaded.model, loaded.tokenizer, texts, _sized(cfg, loaded.model), on_layer, name)
    if target is not None:
        model.to(target)
    if any(isinstance(m, Attention) for m in model.modules()):
        return native.inspect(model, texts, _sized(cfg, model), on_layer, tokenizer, name)
    if hasattr(model, "config") and hasattr(model, "set_attn_implementation"):
        if tokenizer is None:
            raise ConfigError("a Hugging Face model needs its tokenizer: inspect_model(model, texts, tokenizer=...)")
        return hf.inspect(model, tokenizer, texts, _sized(cfg, model), on_layer,
                          getattr(model.config, "_name_or_path", "") or name)
    raise ConfigError(f"cannot read attention from a {type(model).__name__}; give a Hugging Face model or one built from attnscale.core.attention.Attention")


def run(cfg: InspectConfig, texts: str | Sequence[str], out: Path | None = None) -> InspectResult:
    """The CLI's call: load, inspect, and with ``out`` write record.json and heatmaps.png."""
    from attnscale.runs import record as rec, writers

    started = time.time()
    if out is not None:  # before the model loads: a folder of another command's is never written over
        writers.check_out(out, "inspect", (rec.RECORD, HEATMAPS))
    device = resolve_device(cfg.device)  # once: the model is moved there and measured there
    result = _inspect(dataclasses.replace(cfg, device=str(device)), cfg.model, texts, device)
    if out is not None:
        from attnscale.headcheck.show import plot_heatmaps

        # the record first: it marks the folder as inspect's, so a run killed before the figure can be redone
        # the scores are recomputed from q and k in fp32, whatever the weights are in
        cfg = dataclasses.replace(cfg, max_tokens=result.max_tokens)  # the length it read, not "the default"
        rec.write(out, rec.new("inspect", cfg, result, started=started, device=describe_device(device, "fp32")))
        plot_heatmaps(result, Path(out) / HEATMAPS)
    return result
