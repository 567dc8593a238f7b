"""Recording the attention diagnostics on the training step's own forward pass.

Every ``record_every`` steps the forward pass goes through the hooks: each
layer's scores and pattern are reduced on the spot by
``core.diagnostics.head_measures`` (over the first few sequences of the batch)
and dropped, so recording costs one explicit-attention forward and a few
reductions, not an extra pass or kept tensors. The reductions stay on the device
until the step's one read-back (``read_back``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from attnscale.core.diagnostics import HEAD_MEASURES, head_measures
from attnscale.core.hooks import record
from attnscale.lm.model import TinyLM

__all__ = ["DIAGNOSTICS", "Recorder", "recording", "read_back", "summarize"]

DIAGNOSTICS = HEAD_MEASURES  # recorded per layer and head, as diagnostics.head_summary names them


class Recorder:
    """Hook callback: pairs each layer's scores with its pattern and reduces them at once, on the device.

    The reductions stay tensors until ``row``, so a recording step reads the
    device back once (``numbers`` joins them with the step's loss)."""

    def __init__(self, n_layers: int, threshold: float, sequences: int):
        self.threshold, self.sequences = threshold, sequences
        self.scores: dict[int, torch.Tensor] = {}
        self.layers: list[torch.Tensor | None] = [None] * n_layers

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        layer = int(name.split(".")[1])  # "blocks.{i}.attn.hook_*"
        tensor = tensor[: self.sequences]  # the reductions cost more than the forward; a few sequences suffice
        if tensor.device.type == "mps":  # the reductions run in float64, which MPS lacks
            tensor = tensor.cpu()
        if name.endswith("hook_scores"):
            self.scores[layer] = tensor
        else:
            self.layers[layer] = head_measures(self.scores.pop(layer), tensor, self.threshold)

    def tensor(self) -> torch.Tensor:
        """Every diagnostic, flattened from shape (layers, len(DIAGNOSTICS), heads)."""
        return torch.stack(self.layers).flatten()

    def row(self, values: list[float]) -> dict[str, list[list[float]]]:
        """Each diagnostic as a [layer][head] list, from ``tensor().tolist()``."""
        n_layers, n_measures = len(self.layers), len(DIAGNOSTICS)
        heads = len(values) // (n_layers * n_measures)
        out: dict[str, list[list[float]]] = {k: [] for k in DIAGNOSTICS}
        for layer in range(n_layers):
            for m, k in enumerate(DIAGNOSTICS):
                start = (layer * n_measures + m) * heads
                out[k].append(values[start : start + heads])
        return out


def read_back(rec: Recorder | None, *scalars: torch.Tensor) -> tuple[list[float], dict | None]:
    """The step's one device-to-host transfer: ``scalars`` as floats, and the recorded row if any."""
    parts = [s.detach().float().reshape(1) for s in scalars]
    if rec is not None:
        parts.append(rec.tensor().to(parts[0].device))
    values = torch.cat(parts).tolist()
    n = len(scalars)
    return values[:n], (rec.row(values[n:]) if rec is not None else None)


@contextlib.contextmanager
def recording(model: TinyLM, due: bool, threshold: float, sequences: int):
    """Yield a ``Recorder`` hooked into ``model`` when ``due``, else None (no hooks, fused path stays)."""
    if not due:
        yield None
        return
    rec = Recorder(model.cfg.n_layers, threshold, sequences)
    with record(model, ["*hook_scores", "*hook_pattern"], fn=rec):
        yield rec


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """One recorded row in a few numbers: each diagnostic's mean over layers and
    heads (max for max_score), and ``spread_by_layer``/``frozen_by_layer``
    (mean over heads), since the first layer is the one that sees the raw embeddings."""
    out: dict[str, Any] = {}
    for k in DIAGNOSTICS:
        flat = [v for layer in row[k] for v in layer]
        out[k] = max(flat) if k == "max_score" else sum(flat) / len(flat)
    out["spread_by_layer"] = [sum(layer) / len(layer) for layer in row["spread"]]
    out["frozen_by_layer"] = [sum(layer) / len(layer) for layer in row["frozen_fraction"]]
    return out
