"""The measuring engine of ``attnscale inspect``: per-head numbers from the q and k a model uses.

For every layer and head: the spread and largest |score| of the scaled scores,
and from the weights the effective words, the frozen fraction and the push
(definitions in core/diagnostics.py), under the scale the model applies. Then
two what-ifs from the same q and k: the scores unscaled (factor 1) and scaled by
1/d (muP), everything else (mask, any soft-cap) kept as the model has it.

An adapter reads a model's q and k (through ``attnscale.capture``)
and hands them to ``HeadCheck.add`` one layer at a time, with a ``Layer`` that
says what the model does there (its factor, any soft-cap, its head counts).
Scores are recomputed as ``q @ kᵀ × factor -> cap -> mask -> softmax`` and
reduced to per-head sums at once by the capture floor's one reduction
(``capture.reduce.reduce_call``, a block of query rows at a time, on one device). Adapters: ``hf`` (Hugging Face models) and ``native``
(attnscale's own models, training checkpoints and run folders);
``check.inspect_model`` picks one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import dense, reduce_call
from attnscale.capture.stats import HeadStats, pack, unpack
from attnscale.capture.sums import HeadSums
from attnscale.core import diagnostics as D
from attnscale.core.diagnostics import FROZEN_HEAD_SHARE, FROZEN_THRESHOLD, HEAD_MEASURES, measuring_device
from attnscale.core.scales import get_scale
from attnscale.core.device import check_device_spec
from attnscale.errors import ConfigError
from attnscale.core.head_kinds import HeadKinds

__all__ = ["MODEL", "HeadCheck", "InspectConfig", "InspectResult", "Layer", "check_texts", "frozen_heads",
           "layer_means", "read_text", "take_sequences"]

MODEL = "model"  # the scheme name under which the model's own scale is reported
# What-ifs must be plain factors f(d) (no learned parameters) to apply to any model's q and k.
PLAIN_FACTORS = ("none", "inv_sqrt_d", "inv_d")

OnLayer = Callable[[int, str, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class InspectConfig:
    """What to inspect. ``sequences=None`` reads every sequence the text gives.
    ``max_tokens=None``: what the model takes (``check.default_max_tokens``).
    ``device``: where the model runs and the measurements are reduced ("auto", "cpu", "cuda", "cuda:N", "mps")."""

    model: str
    max_tokens: int | None = None
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
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ConfigError("--max-tokens must be at least 2: a row needs two keys to be frozen or free")
        bad = [w for w in self.what_ifs if w not in PLAIN_FACTORS]
        if bad:
            raise ConfigError(f"what-if scale {bad[0]!r} has parameters of its own; choose from {', '.join(PLAIN_FACTORS)}")


@dataclass
class InspectResult:
    """Per-head measurements of one model on one text, with where its scale comes from.

    ``stats``: per scheme, the ``HeadStats`` every measurement of attnscale gives (a watch probe's, a
    training step's), of which the rest is a reading.
    ``rows``: one per (layer, head), each scheme's ``diagnostics.HEAD_MEASURES``.
    ``per_layer``: per layer, each scheme's mean over the layer's heads.
    ``frozen_heads``: per scheme, the heads with more than ``frozen_head_share``
    of their rows frozen."""

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
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    frozen_heads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    frozen_head_share: float = FROZEN_HEAD_SHARE
    max_tokens: int | None = None  # the length sequences were cut to
    # the sink and previous-token heads under the model's scale (``core/head_kinds.py``): {"layer", "head", "kind", "share"}
    head_kinds: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, HeadStats] = field(default_factory=dict, metadata={"json": False})  # JSON: rows

    @property
    def schemes(self) -> tuple[str, ...]:
        return (MODEL, *self.what_ifs)


@dataclass(frozen=True)
class Layer:
    """What the model does in one layer: its factor, cap and head counts, and
    where the factor comes from (in words, for the reader)."""

    factor: float
    cap: Callable[[torch.Tensor], torch.Tensor] | None
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    source: str
    softcap: float | None = None
    architecture: str = ""


class HeadCheck:
    """Per-head numbers of one model on one text, pooled over batches.

    ``add`` one layer's q (B×H×T×D), k (B×K×T×D, K key/value heads) and mask
    (B×1×T×T, True where a query may see a key) at a time, batch after batch;
    ``result`` gives the ``InspectResult``. ``on_layer(layer, scheme,
    scores_BHTT, pattern_BHTT)`` sees each layer's tensors as they pass (scheme
    "model" is the model's own scale), before they are dropped."""

    def __init__(self, cfg: InspectConfig, on_layer: OnLayer | None = None):
        self.cfg, self.on_layer = cfg, on_layer
        self.layers: dict[int, Layer] = {}
        self._device: torch.device | None = None
        self._sums: dict[tuple[int, str], HeadSums] = {}
        self._kinds = HeadKinds()

    def add(self, index: int, layer: Layer, q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, mask_B1TT: torch.Tensor,
            bias: torch.Tensor | None = None) -> None:
        """Scores and weights of layer ``index`` under the model's scale and each
        what-if, reduced to per-head sums at once. ``bias`` (a position bias, e.g. T5's or ALiBi's) enters
        the weights under every scheme, never the scores."""
        self.layers[index] = layer
        if self._device is None:  # one device for every layer (a model spread over GPUs), the CPU for MPS (no float64)
            self._device = torch.device(measuring_device(q_BHTD.device))
        q_BHTD, k_BKTD, mask_B1TT = (t.to(self._device) for t in (q_BHTD, k_BKTD, mask_B1TT))
        bias = None if bias is None else bias.to(self._device)
        call = AttentionCall(q_BHTD, k_BKTD, mask=mask_B1TT, cap=layer.cap, bias=bias)  # GQA read as repeat_kv does
        factors = {MODEL: layer.factor, **{w: get_scale(w, layer.head_dim).factor() for w in self.cfg.what_ifs}}
        for scheme, factor in factors.items():
            sums = self._sums.setdefault((index, scheme), HeadSums(layer.heads, self.cfg.threshold, self._device))
            reduce_call(call, sums, factor=factor)
            if scheme == MODEL or self.on_layer is not None:
                scores, pattern = dense(call, factor)
                if scheme == MODEL:  # which heads are sinks or previous-token heads
                    self._kinds.add(index, pattern, scores > -math.inf)
                if self.on_layer is not None:  # the whole tensors, for callers who want them
                    self.on_layer(index, scheme, scores, pattern)

    def result(self, model: str, architecture: str, sequences: list[list[int]], available: int,
               notes: list[str] | None = None) -> InspectResult:
        """The per-head numbers so far; ``sequences`` are those read (of ``available``)."""
        layers, notes = self.layers, list(notes or [])
        if not layers:
            raise ConfigError(f"--model: no attention layer of {model!r} ran; give a model whose attention inspect can read")
        first = layers[min(layers)]
        if len({(l.factor, l.softcap) for l in layers.values()}) > 1:
            notes.append("the scale differs between layers: " + ", ".join(f"{i}: {l.factor:.6g}" for i, l in sorted(layers.items())))
        schemes = (MODEL, *self.cfg.what_ifs)
        order = sorted(layers)
        names, heads = tuple(f"layer {i}" for i in order), tuple(layers[i].heads for i in order)
        stats = {scheme: unpack(pack([self._sums[(i, scheme)] for i in order]).cpu(), names, heads, dtype=torch.float64)
                 for scheme in schemes}
        grids = {scheme: stats[scheme].grids() for scheme in schemes}
        rows = [{"layer": i, "head": h, **{scheme: {k: grids[scheme][k][n][h] for k in HEAD_MEASURES} for scheme in schemes}}
                for n, i in enumerate(order) for h in range(layers[i].heads)]
        return InspectResult(
            model=model, architecture=f"{architecture} ({first.architecture})", layers=len(layers), heads=first.heads,
            kv_heads=first.kv_heads, head_dim=first.head_dim, causal=first.causal, scale=first.factor,
            scale_source=first.source, softcap=first.softcap, sequences=len(sequences), sequences_available=available,
            tokens=sum(len(s) for s in sequences), threshold=self.cfg.threshold, what_ifs=tuple(self.cfg.what_ifs),
            rows=rows, notes=notes, per_layer=layer_means(rows, schemes), frozen_heads=frozen_heads(rows, schemes),
            max_tokens=self.cfg.max_tokens, stats=stats, head_kinds=self._head_kinds(order),
        )

    def _head_kinds(self, order: list[int]) -> list[dict[str, Any]]:
        marked = []
        for i in order:
            first, prev = self._kinds.shares(i)
            for h, kind in enumerate(self._kinds.kinds(i)):
                if kind:
                    marked.append({"layer": i, "head": h, "kind": kind, "share": first[h] if kind == "sink" else prev[h]})
        return marked


def layer_means(rows: list[dict[str, Any]], schemes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per layer, the mean over its heads of each measurement under each scheme."""
    out = []
    for i in sorted({r["layer"] for r in rows}):
        mine = [r for r in rows if r["layer"] == i]
        entry: dict[str, Any] = {"layer": i}
        for scheme in schemes:
            entry[scheme] = {k: D.reduce_heads([[r[scheme][k] for r in mine]]) for k in mine[0][scheme]}
        out.append(entry)
    return out


def frozen_heads(rows: list[dict[str, Any]], schemes: tuple[str, ...],
                 share: float = FROZEN_HEAD_SHARE) -> dict[str, list[dict[str, Any]]]:
    """Per scheme, the heads with more than ``share`` of their rows frozen."""
    return {scheme: [{"layer": r["layer"], "head": r["head"], "frozen_fraction": r[scheme]["frozen_fraction"],
                      "max_score": r[scheme]["max_score"], "effective_words": r[scheme]["effective_words"]}
                     for r in rows if r[scheme]["frozen_fraction"] > share]
            for scheme in schemes}


# ---- text -----------------------------------------------------------------------


def check_texts(texts) -> list[str]:
    """The non-empty texts of a string or a list of them; a ConfigError if there are none."""
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
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark is not the text's first token
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--file: cannot read {str(path)!r} as UTF-8 text ({getattr(e, 'reason', None) or e.strerror}); give a UTF-8 text file") from None


def take_sequences(seqs: list[list[int]], cfg: InspectConfig) -> tuple[list[list[int]], int]:
    """The first ``cfg.sequences`` token sequences, and how many the text gave."""
    available = len(seqs)
    seqs = seqs[: cfg.sequences] if cfg.sequences else seqs
    if not seqs or max(len(s) for s in seqs) < 2:
        raise ConfigError("the text gives a single token; give a longer text (a row needs two words to attend to)")
    return seqs, available
