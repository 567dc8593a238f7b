"""Recording the attention diagnostics on the training step's own forward pass.

Every ``record_every`` steps the forward pass goes through the capture floor's
``capture_weights``: each layer's scores, as the model computes them, are
reduced on the spot by the one per-head reduction (``capture.reduce.reduce_scores``,
over the first few sequences of the batch, into a ``HeadSums`` per layer) and dropped, and read back as
the ``HeadStats`` the watch and inspect give (``capture.stats``), so recording costs one
explicit-attention forward and a few reductions, not an extra pass or kept
tensors. The reductions stay on the device until the step's one read-back
(``read_back``). On MPS, which has no float64 for the reductions, the layers'
scores wait on the device instead and travel to the CPU with the step's scalars
in that one transfer."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from attnscale.capture.own import attention_modules, capture_weights
from attnscale.capture.reduce import reduce_scores
from attnscale.capture.stats import HeadStats, grids, pack, packed_width, unpack
from attnscale.capture.sums import HeadSums
from attnscale.core.diagnostics import HEAD_MEASURES, reduce_heads
from attnscale.lm.model import TinyLM

__all__ = ["DIAGNOSTICS", "PROBED", "Recorder", "recording", "read_back", "summarize", "qk_weight_rms", "probe_row"]

DIAGNOSTICS = HEAD_MEASURES  # recorded per layer and head, in the reduction's order
# Read with the heads at every recording step, beside them: the step's gradient norm (before clipping),
# the mean log Z of the output logits, and each layer's q and k projection weight RMS (before the update).
PROBED = ("grad_norm", "log_z", "q_rms", "k_rms")
# Devices whose layers wait for the read-back to be reduced on the CPU (``measuring_device``: no float64 there).
DEFERRED = ("mps",)


class Recorder:
    """Called with each layer's scores (and pattern, which the reduction recomputes from them); reduces
    them at once, on the device, into the layer's ``HeadSums``: the one reduction the watch and inspect use.

    The sums stay on the device until the step's one read-back: ``tensor`` packs them
    (``capture.stats.pack``) for ``read_back`` to join with the step's loss, and ``stats`` reads them back
    as the ``HeadStats`` every measurement gives. On a ``DEFERRED`` device the (few sequences of) scores
    are kept instead, and ``read_back`` reduces them after the one transfer."""

    def __init__(self, names: list[str], threshold: float, sequences: int):
        self.names, self.threshold, self.sequences = tuple(names), threshold, sequences
        self.layers: list[HeadSums | None] = [None] * len(names)
        self.pending: list[tuple[int, torch.Tensor]] = []

    def __call__(self, layer: int, scores_BHTT: torch.Tensor, pattern_BHTT: torch.Tensor | None = None) -> None:
        # the reductions cost more than the forward; a few sequences suffice
        scores_BHTT = scores_BHTT[: self.sequences]
        if scores_BHTT.device.type in DEFERRED:  # no sync here: a copy waits on the device for the read-back
            self.pending.append((layer, scores_BHTT.clone()))
        else:
            self.layers[layer] = reduce_scores(scores_BHTT, threshold=self.threshold)

    def reduce(self, flat: torch.Tensor) -> None:
        """Reduce the pending layers from ``flat``, their scores (as ``float()``, flattened, in ``pending``'s
        order) already on the CPU."""
        start = 0
        for layer, scores in self.pending:
            self.layers[layer] = reduce_scores(flat[start : start + scores.numel()].view(scores.shape),
                                               threshold=self.threshold)
            start += scores.numel()
        self.pending = []

    def tensor(self) -> torch.Tensor:
        """Every layer's packed sums (``capture.stats.pack``, float32, no standard errors: no row is sampled), flat."""
        return pack(self.layers, torch.float32, errors=False).flatten()

    def stats(self, values: list[float]) -> HeadStats:
        """The ``HeadStats`` of ``tensor().tolist()``."""
        shape = (len(self.layers), packed_width(errors=False), -1)
        return unpack(torch.tensor(values, dtype=torch.float32).view(shape), self.names,
                      tuple(s.heads for s in self.layers))

    def row(self, values: list[float]) -> dict[str, list[list[float]]]:
        """Each diagnostic as a [layer][head] list, from ``tensor().tolist()``: ``stats(values).grids()``, read
        straight off the list, so that recording adds no tensor read to the step's one (tests/core/test_device.py)."""
        return grids(values, DIAGNOSTICS, [s.heads for s in self.layers], packed_width(errors=False))


def read_back(rec: Recorder | None, *scalars: torch.Tensor) -> tuple[list[float], dict | None]:
    """The step's one device-to-host transfer: ``scalars`` as floats, and the recorded row if any."""
    parts = [s.detach().float().reshape(1) for s in scalars]
    n = len(scalars)
    if rec is not None and rec.pending:  # the one transfer carries the layers too; reduced on the CPU
        waiting = [s.float().flatten() for _, s in rec.pending]
        flat = torch.cat(parts + waiting).cpu()
        rec.reduce(flat[n:])
        parts = [flat[:n]]
    if rec is not None:
        parts.append(rec.tensor().to(parts[0].device))
    values = torch.cat(parts).tolist()
    return values[:n], (rec.row(values[n:]) if rec is not None else None)


@contextlib.contextmanager
def recording(model: TinyLM, due: bool, threshold: float, sequences: int):
    """Yield a ``Recorder`` hooked into ``model`` when ``due``, else None (no hooks, fused path stays)."""
    if not due:
        yield None
        return
    rec = Recorder([name for name, _ in attention_modules(model)], threshold, sequences)
    with capture_weights(model, rec):
        yield rec


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """One recorded row in a few numbers: each diagnostic's mean over layers and
    heads (max for max_score), and ``spread_by_layer``/``frozen_by_layer``
    (mean over heads), since the first layer is the one that sees the raw embeddings."""
    out: dict[str, Any] = {k: reduce_heads(row[k], "max" if k == "max_score" else "mean") for k in DIAGNOSTICS}
    out["spread_by_layer"] = reduce_heads(row["spread"], per_layer=True)
    out["frozen_by_layer"] = reduce_heads(row["frozen_fraction"], per_layer=True)
    return out


def qk_weight_rms(model: TinyLM) -> list[torch.Tensor]:
    """Each layer's q then k projection weight RMS, sqrt(mean(w²)), as 0-d tensors on the device (read back
    with the step's scalars)."""
    with torch.no_grad():
        return [w.detach().float().pow(2).mean().sqrt() for block in model.blocks
                for w in (block.attn.q_proj.weight, block.attn.k_proj.weight)]


def probe_row(probed: list[float], grad_norm: float) -> dict[str, Any]:
    """The ``PROBED`` fields of a recording step from ``[log_z, q₀, k₀, q₁, k₁, …]`` as read back
    (empty: not a recording step); a value that is not finite is written None, as the loss is."""
    if not probed:
        return {}
    def ok(v):
        return v if math.isfinite(v) else None
    log_z, *rms = probed
    return {"grad_norm": ok(grad_norm), "log_z": ok(log_z), "q_rms": [ok(v) for v in rms[0::2]],
            "k_rms": [ok(v) for v in rms[1::2]]}
