"""Health check for the attention heads of a real model: ``attnscale inspect``.

For every layer and head: the spread and largest |score| of the scaled scores,
and from the weights the effective words, the frozen fraction and the push
(definitions in diagnostics.py), under the scale the model applies. Then two
what-ifs from the same q and k: the scores unscaled (factor 1) and scaled by 1/d
(muP), everything else (mask, any soft-cap) kept as the model has it.

Scores are recomputed as ``q @ kᵀ × factor -> cap -> mask -> masked_softmax``
from the q and k the model itself uses (tests check the weights against the
model's own), one layer at a time, and reduced to numbers at once, so memory
holds one layer's B×H×T×T, not all of them.

Models: Hugging Face (see hf.py), any module holding
``attnscale.core.attention.Attention`` heads (read through their hook points), and
train.py's ``checkpoint.pt`` (a TinyLM, read with its corpus's tokenizer).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnscale.core.attention import Attention, masked_softmax
from attnscale.core import diagnostics as D
from attnscale.core.device import check_device_spec, describe_device, resolve_device
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError
from attnscale.core.hooks import record
from attnscale.core.scales import ScoreScale, get_scale

__all__ = ["InspectConfig", "InspectResult", "format_table", "inspect_model", "layer_means", "load_checkpoint",
           "plot_heatmaps", "read_text", "run"]

MODEL = "model"  # the scheme name under which the model's own scale is reported
ROW_KEYS = ("effective_words", "frozen_fraction", "push", "max_weight")
# What-ifs must be plain factors f(d) (no learned parameters) to apply to any model's q and k.
PLAIN_FACTORS = ("none", "inv_sqrt_d", "inv_d")

OnLayer = Callable[[int, str, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class InspectConfig:
    """What to inspect. ``sequences=None`` reads every sequence the text gives.
    ``device``: where the model runs and the measurements are reduced ("auto", "cpu", "cuda", "cuda:N", "mps")."""

    model: str
    max_tokens: int = 128
    batch: int = 8
    sequences: int | None = 16
    threshold: float = FROZEN_THRESHOLD
    what_ifs: tuple[str, ...] = ("none", "inv_d")
    device: str = "auto"

    def __post_init__(self):
        check_device_spec(self.device)
        for name in ("max_tokens", "batch", "sequences"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.max_tokens < 2:
            raise ConfigError("--max-tokens must be at least 2: a row needs two keys to be frozen or free")
        bad = [w for w in self.what_ifs if w not in PLAIN_FACTORS]
        if bad:
            raise ConfigError(f"what-if scale {bad[0]!r} has parameters of its own; choose from {', '.join(PLAIN_FACTORS)}")


@dataclass
class InspectResult:
    """Per-head measurements of one model on one text, with where its scale comes from."""

    model: str
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    scale: float
    scale_source: str
    softcap: float | None
    sequences: int
    sequences_available: int
    tokens: int
    threshold: float
    what_ifs: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per (layer, head)
    notes: list[str] = field(default_factory=list)


class _Pool:
    """One layer's per-head numbers under one scheme, summed over batches.

    The row measurements are diagnostics.py's functions; what this adds is
    pooling per-head sums over batches, so a long text never needs all its
    weights at once. test_inspect checks the pooled numbers equal
    ``diagnostics.head_summary`` on the same weights."""

    def __init__(self, heads: int, device: torch.device | None = None):
        z = lambda: torch.zeros(heads, dtype=torch.float64, device=device)
        self.entries, self.rows = 0.0, 0.0
        self.sum, self.sum_sq, self.max_abs = z(), z(), z()
        self.row_sums = {k: z() for k in ROW_KEYS}

    def add_scores(self, scores_BHTT: torch.Tensor, keep_B1TT: torch.Tensor) -> None:
        """Spread and max |score| over the entries that count (``keep``)."""
        # in float64: E[x²] - mean² loses digits when the scores have a large mean
        x_BHTT = (scores_BHTT * keep_B1TT).double()
        self.entries += float(keep_B1TT.sum())
        self.sum += x_BHTT.sum((0, 2, 3)).double()
        self.sum_sq += x_BHTT.pow(2).sum((0, 2, 3)).double()
        self.max_abs = torch.maximum(self.max_abs, x_BHTT.abs().amax((0, 2, 3)).double())

    def add_rows(self, pattern_NHT: torch.Tensor, threshold: float) -> None:
        """Row statistics of rows that see at least two keys (all rows of ``pattern_NHT``)."""
        mw_NH = D.max_weight(pattern_NHT)
        stats = {
            "effective_words": D.effective_words(pattern_NHT),
            "frozen_fraction": (mw_NH > threshold).float(),
            "push": D.push(pattern_NHT),
            "max_weight": mw_NH,
        }
        self.rows += pattern_NHT.shape[0]
        for k, v_NH in stats.items():
            self.row_sums[k] += v_NH.sum(0).double()

    def result(self) -> dict[str, list[float]]:
        n, rows = max(self.entries, 1.0), max(self.rows, 1.0)
        mean = self.sum / n
        out = {"spread": (self.sum_sq / n - mean**2).clamp_min(0).sqrt(), "max_score": self.max_abs}
        out.update({k: v / rows for k, v in self.row_sums.items()})
        return {k: v.tolist() for k, v in out.items()}


@dataclass(frozen=True)
class _Layer:
    """What the model does in one layer: its factor, cap and head counts."""

    factor: float
    cap: Callable[[torch.Tensor], torch.Tensor] | None
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    source: str
    softcap: float | None = None
    architecture: str = ""


def _measure(pools, index: int, layer: _Layer, q_BHTD, k_BKTD, mask_B1TT, cfg: InspectConfig, on_layer: OnLayer | None) -> None:
    """Scores and weights of one layer under the model's scale and each what-if,
    reduced to per-head sums at once. ``mask_B1TT``: True where a query may see a key.
    The sums stay on q's device (float64; on MPS, which lacks it, they are taken on the CPU)."""
    if q_BHTD.device.type == "mps":
        q_BHTD, k_BKTD, mask_B1TT = q_BHTD.cpu(), k_BKTD.cpu(), mask_B1TT.cpu()
    if layer.kv_heads != layer.heads:  # GQA: query head h reads kv head h // (H / K), as repeat_kv does
        k_BKTD = k_BKTD.repeat_interleave(layer.heads // layer.kv_heads, dim=1)
    raw_BHTT = q_BHTD.float() @ k_BKTD.float().transpose(-2, -1)
    keep_B1TT = mask_B1TT.float()
    # Rows that see two keys or more are the rows that count (diagnostics.head_summary's rule);
    # gather them once as N rows × H heads × T keys.
    rows_BT = mask_B1TT[:, 0].sum(-1) >= 2
    raw_NHT = raw_BHTT.permute(0, 2, 1, 3)[rows_BT]
    bias_N1T = torch.zeros(mask_B1TT[:, 0][rows_BT].shape, device=raw_BHTT.device).masked_fill(~mask_B1TT[:, 0][rows_BT], float("-inf"))[:, None]
    factors = {MODEL: layer.factor, **{w: get_scale(w, layer.head_dim).factor() for w in cfg.what_ifs}}
    for scheme, factor in factors.items():
        pool = pools.setdefault((index, scheme), _Pool(layer.heads, raw_BHTT.device))
        scaled_NHT = raw_NHT * factor
        if layer.cap is None:
            pool.add_scores(raw_BHTT * factor, keep_B1TT)
        else:
            scaled_NHT = layer.cap(scaled_NHT)
            pool.add_scores(layer.cap(raw_BHTT * factor), keep_B1TT)
        pool.add_rows(torch.softmax(scaled_NHT + bias_N1T, dim=-1), cfg.threshold)
        if on_layer is not None:  # the reference path, for callers who want the tensors themselves
            scores_BHTT = raw_BHTT * factor if layer.cap is None else layer.cap(raw_BHTT * factor)
            scores_BHTT = scores_BHTT.masked_fill(~mask_B1TT, float("-inf"))
            on_layer(index, scheme, scores_BHTT, masked_softmax(scores_BHTT, mask_B1TT))


def _check_texts(texts) -> list[str]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not any(t.strip() for t in texts):
        raise ConfigError("the text is empty; give some words with --text or a non-empty --file")
    return [t for t in texts if t.strip()]


def read_text(path: Path) -> str:
    """The text of a UTF-8 file, or a one-line ConfigError naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--file: {str(path)!r} {'is a folder' if path.is_dir() else 'does not exist'}; give a UTF-8 text file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--file: cannot read {str(path)!r} as UTF-8 text ({getattr(e, 'reason', None) or e.strerror}); give a UTF-8 text file") from None


def _take(seqs: list[list[int]], cfg: InspectConfig) -> tuple[list[list[int]], int]:
    available = len(seqs)
    seqs = seqs[: cfg.sequences] if cfg.sequences else seqs
    if not seqs or max(len(s) for s in seqs) < 2:
        raise ConfigError("the text gives a single token; give a longer text (a row needs two words to attend to)")
    return seqs, available


# ---- attnscale models ----------------------------------------------------------


def load_checkpoint(path: Path) -> tuple[nn.Module, Callable[[str], torch.Tensor]]:
    """A TinyLM and its corpus's encoder from train.py's ``checkpoint.pt``."""
    from attnscale.lm.data import load_corpus
    from attnscale.lm.model import ModelConfig, build_model

    if not path.is_file():
        raise ConfigError(f"--model: {str(path)!r} does not exist; give the checkpoint.pt of an attnscale training run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model(ModelConfig(**state["config"]["model"]))
        model.load_state_dict(state["model"])
        corpus = state["config"]["corpus"]
    except (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as e:
        raise ConfigError(f"--model: {str(path)!r} is not an attnscale checkpoint ({type(e).__name__}); "
                          "give the checkpoint.pt of an attnscale training run") from None
    codec = load_corpus(corpus["name"], corpus["tokenizer"])
    if codec.sha256 != corpus["sha256"]:
        raise ConfigError(f"--model: the corpus {corpus['name']!r} has changed since {str(path)!r} was trained; restore it to read text")
    return model.eval(), codec.encode


def _inspect_attnscale(model: nn.Module, texts, cfg: InspectConfig, on_layer, tokenizer, name: str) -> InspectResult:
    attns = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    if isinstance(texts, torch.Tensor):
        ids = texts.long().reshape(-1, texts.shape[-1]) if texts.ndim > 1 else texts.long()[None]
        rows = ids.tolist()
    elif tokenizer is not None:
        rows = [list(map(int, tokenizer(t))) for t in _check_texts(texts)]
    else:
        raise ConfigError("an attnscale model takes token ids; pass a LongTensor, or a tokenizer (e.g. corpus.encode) with the texts")
    context = getattr(getattr(model, "cfg", None), "context", None)
    if context and cfg.max_tokens > context:
        raise ConfigError(f"--max-tokens {cfg.max_tokens} is more than the model's context of {context}; give at most {context}")
    seqs, available = _take([r[i : i + cfg.max_tokens] for r in rows for i in range(0, len(r), cfg.max_tokens)], cfg)
    module_of = {f"{n}.hook_{h}" if n else f"hook_{h}": (i, m) for i, (n, m) in enumerate(attns) for h in ("q", "k", "scores")}
    layers: dict[int, _Layer] = {}
    pools: dict = {}
    seen: dict[str, torch.Tensor] = {}

    def fn(hook: str, tensor: torch.Tensor) -> None:
        i, m = module_of[hook]
        if not hook.endswith("hook_scores"):
            seen[hook.rsplit("_", 1)[-1]] = tensor
            return
        q_BHTD, k_BHTD = m.scale.prepare(seen.pop("q"), seen.pop("k"))
        factor = float(m.scale.factor())
        custom_cap = type(m.scale).cap is not ScoreScale.cap
        source = f"attnscale scale {m.scale.name!r} with d_k = {m.head_dim}: {(type(m.scale).__doc__ or '').strip().splitlines()[0].rstrip('.')}"
        layers[i] = _Layer(factor, m.scale.cap if custom_cap else None, m.n_heads, m.n_heads, m.head_dim, m.causal,
                           source, getattr(m.scale, "cap_value", None), type(m).__name__)
        # the model's own mask: the entries its hook_scores holds as -inf
        _measure(pools, i, layers[i], q_BHTD, k_BHTD, torch.isfinite(tensor[:, :1]), cfg, on_layer)

    # Sequences of one length go together: the attnscale models take no padding mask.
    by_len: dict[int, list[list[int]]] = {}
    for s in seqs:
        by_len.setdefault(len(s), []).append(s)
    with record(model, list(module_of), fn=fn), torch.no_grad():
        for group in by_len.values():
            for start in range(0, len(group), cfg.batch):
                model(torch.tensor(group[start : start + cfg.batch]).to(_device_of(model), non_blocking=True))
    return _result(name, type(model).__name__, layers, pools, cfg, seqs, available, [])


# ---- the call ------------------------------------------------------------------


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _result(name, arch, layers: dict[int, _Layer], pools, cfg, seqs, available, notes) -> InspectResult:
    if not layers:
        raise ConfigError(f"--model: no attention layer of {name!r} ran; give a model whose attention inspect can read")
    first = layers[min(layers)]
    if len({(l.factor, l.softcap) for l in layers.values()}) > 1:
        notes.append("the scale differs between layers: " + ", ".join(f"{i}: {l.factor:.6g}" for i, l in sorted(layers.items())))
    rows = []
    for i in sorted(layers):
        per = {scheme: pools[(i, scheme)].result() for scheme in (MODEL, *cfg.what_ifs)}
        for h in range(layers[i].heads):
            row = {"layer": i, "head": h}
            row.update({scheme: {k: v[h] for k, v in per[scheme].items()} for scheme in per})
            rows.append(row)
    return InspectResult(
        model=name, architecture=f"{arch} ({first.architecture})", layers=len(layers), heads=first.heads,
        kv_heads=first.kv_heads, head_dim=first.head_dim, causal=first.causal, scale=first.factor,
        scale_source=first.source, softcap=first.softcap, sequences=len(seqs), sequences_available=available,
        tokens=sum(len(s) for s in seqs), threshold=cfg.threshold, what_ifs=tuple(cfg.what_ifs), rows=rows, notes=notes,
    )


def inspect_model(
    model: str | nn.Module,
    texts: str | Sequence[str] | torch.Tensor,
    *,
    tokenizer=None,
    max_tokens: int = 128,
    batch: int = 8,
    sequences: int | None = 16,
    threshold: float = FROZEN_THRESHOLD,
    what_ifs: tuple[str, ...] = ("none", "inv_d"),
    on_layer: OnLayer | None = None,
    device: str | torch.device | None = None,
) -> InspectResult:
    """Measure every head of ``model`` on ``texts``.

    ``model``: a shortcut, folder or .gguf path (loaded offline), a loaded
    Hugging Face model (give its ``tokenizer``), or a module holding attnscale
    ``Attention`` heads (give token ids, or texts and a ``tokenizer`` callable).
    Each text is cut into sequences of at most ``max_tokens``; the first
    ``sequences`` of them are read, ``batch`` per forward pass. ``on_layer(layer,
    scheme, scores_BHTT, pattern_BHTT)`` sees each layer's tensors as they pass
    (scheme "model" is the model's own scale), before they are dropped.

    ``device`` (a spec or a ``torch.device``): the model is moved there and measured
    there; None leaves a given module where it is and loads a named one on the CPU."""
    target = resolve_device(device) if device is not None else None
    cfg = InspectConfig(model if isinstance(model, str) else type(model).__name__, max_tokens, batch, sequences, threshold,
                        tuple(what_ifs), **({"device": str(target)} if target is not None else {}))
    if not isinstance(texts, torch.Tensor):
        texts = _check_texts(texts)  # before a load that may take half a minute
    if isinstance(model, str) and model.endswith(".pt"):
        model, encode = load_checkpoint(Path(model))
        tokenizer = tokenizer or encode
    if isinstance(model, str):
        from attnscale.headcheck import hf

        loaded = hf.load(model)
        if target is not None:
            loaded.model.to(target)
        return hf.inspect(loaded.model, loaded.tokenizer, texts, cfg, on_layer, model)
    if target is not None:
        model.to(target)
    if any(isinstance(m, Attention) for m in model.modules()):
        return _inspect_attnscale(model, texts, cfg, on_layer, tokenizer, cfg.model)
    if hasattr(model, "config") and hasattr(model, "set_attn_implementation"):
        if tokenizer is None:
            raise ConfigError("a Hugging Face model needs its tokenizer: inspect_model(model, texts, tokenizer=...)")
        from attnscale.headcheck import hf

        return hf.inspect(model, tokenizer, texts, cfg, on_layer, getattr(model.config, "_name_or_path", "") or cfg.model)
    raise ConfigError(f"cannot read attention from a {type(model).__name__}; give a Hugging Face model or one built from attnscale.core.attention.Attention")


# ---- output --------------------------------------------------------------------

_WHAT_IF_TITLES = {"none": "unscaled", "inv_sqrt_d": "1/sqrt(d)", "inv_d": "1/d"}


def layer_means(result: InspectResult) -> list[dict[str, Any]]:
    """Per layer, the mean over heads of each measurement under each scheme."""
    out = []
    for i in sorted({r["layer"] for r in result.rows}):
        rows = [r for r in result.rows if r["layer"] == i]
        entry: dict[str, Any] = {"layer": i}
        for scheme in (MODEL, *result.what_ifs):
            entry[scheme] = {k: sum(r[scheme][k] for r in rows) / len(rows) for k in rows[0][scheme]}
        out.append(entry)
    return out


def format_table(result: InspectResult, per_head: bool = True) -> str:
    """Per-head table (or per-layer means) under the model's scale, then the what-ifs."""
    gqa = f", {result.kv_heads} KV heads (GQA)" if result.kv_heads != result.heads else ""
    cap = f"; soft-cap {result.softcap:g}·tanh(s/{result.softcap:g})" if result.softcap else "; no soft-cap"
    lines = [
        (f"model   {result.model}: {result.architecture}, {result.layers} layers x {result.heads} heads{gqa}, "
         f"d_k {result.head_dim}, {'causal' if result.causal else 'bidirectional'}"),
        f"scale   {result.scale:.6g} = {result.scale_source}{cap}",
        (f"text    {result.sequences} of {result.sequences_available} sequences, {result.tokens} tokens; "
         f"frozen = max weight > {result.threshold:g}; rows that see one key are left out"),
    ]
    lines += [f"note    {n}" for n in result.notes]
    lines += [] if per_head else ["rows    per layer: the mean over its heads"]
    what = "".join(f"  {_WHAT_IF_TITLES.get(w, w):>15}" for w in result.what_ifs)
    lines += ["", f"{'layer':>5} {'head':>4}  {'spread':>7} {'max|s|':>7} {'eff.words':>9} {'frozen':>7} {'push':>6} {what}",
              " " * 53 + "".join(f"  {'eff.w':>7} {'frozen':>7}" for _ in result.what_ifs)]
    entries = result.rows if per_head else [dict(r, head="all") for r in layer_means(result)]
    for r in entries:
        m = r[MODEL]
        line = (f"{r['layer']:>5} {r['head']:>4}  {m['spread']:>7.2f} {m['max_score']:>7.2f} {m['effective_words']:>9.2f} "
                f"{m['frozen_fraction']:>7.1%} {m['push']:>6.3f} ")
        line += "".join(f"  {r[w]['effective_words']:>7.2f} {r[w]['frozen_fraction']:>7.1%}" for w in result.what_ifs)
        lines.append(line)
    return "\n".join(lines)


def plot_heatmaps(result: InspectResult, path: Path) -> Path:
    """Layers × heads heatmaps of effective words and frozen fraction, one column per scheme."""
    from attnscale.report import plots

    titles = {s: f"model ({result.scale:.3g})" if s == MODEL else _WHAT_IF_TITLES.get(s, s)
              for s in (MODEL, *result.what_ifs)}
    return plots.head_heatmaps(result.rows, titles, result.layers, result.heads,
                               f"{result.model}: {result.tokens} tokens", path)


def run(cfg: InspectConfig, texts: str | Sequence[str], out: Path | None = None) -> InspectResult:
    """The CLI's call: load, inspect, and with ``out`` write record.json and heatmaps.png."""
    import time

    started = time.time()
    device = resolve_device(cfg.device)  # once: the model is moved there and measured there
    result = inspect_model(cfg.model, texts, max_tokens=cfg.max_tokens, batch=cfg.batch, sequences=cfg.sequences,
                           threshold=cfg.threshold, what_ifs=cfg.what_ifs, device=device)
    if out is not None:
        from attnscale.runs.store import write_record

        plot_heatmaps(result, Path(out) / "heatmaps.png")
        write_record(out, "inspect", cfg, result, started=started,
                     # the scores are recomputed from q and k in fp32, whatever the weights are in
                     extra={"device": describe_device(device, "fp32")})
    return result
