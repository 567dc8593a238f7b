"""The frozen share at several thresholds, from a training run's final weights in fp32.

A frozen row is one whose largest weight exceeds a threshold (0.99 by default,
``core.diagnostics.FROZEN_THRESHOLD``). Whether "99.9% of rows frozen" is a fact
about the head or about where the line is drawn shows only across thresholds,
so this reads the share at 0.5, 0.9, 0.99 and 0.999 in one pass. It is read from
the final weights in float32, not from the training record: a run trained in
bf16 rounds scores near 10³ in steps of 4–8, which ties top scores and lowers
the recorded share, and the record measures only the first 4 sequences of a
batch. Rows are counted as the training record counts them (those that see at
least ``diagnostics.MIN_KEYS`` keys); each layer's share is over all its heads' rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnscale.core import diagnostics as D
from attnscale.headcheck import native
from attnscale.headcheck.engine import MODEL, InspectConfig

__all__ = ["THRESHOLDS", "frozen_by_threshold"]

THRESHOLDS = (0.5, 0.9, 0.99, 0.999)


def frozen_by_threshold(run_dir: Path, ids_NT: torch.Tensor, thresholds: tuple[float, ...] = THRESHOLDS,
                        batch: int = 8) -> dict[str, Any]:
    """Per layer, the share of rows whose largest weight exceeds each threshold, for the run in
    ``run_dir`` (its final weights, in float32) over the sequences ``ids_NT`` (N sequences of T tokens,
    T at most the model's context). Returns {"thresholds", "by_layer": [[share per threshold] per layer],
    "all_layers": [share per threshold], "rows": rows counted per layer, "sequences": N}."""
    model, _ = native.load_run(Path(run_dir))
    model = model.float()
    frozen: dict[int, torch.Tensor] = {}
    rows: dict[int, int] = {}
    limits = torch.tensor(thresholds, dtype=torch.float64)

    def on_layer(index: int, scheme: str, scores_BHTT: torch.Tensor, pattern_BHTT: torch.Tensor) -> None:
        if scheme != MODEL:
            return
        counted = D.counted_rows(torch.isfinite(scores_BHTT))  # B×H×T: rows that see MIN_KEYS keys or more
        top = pattern_BHTT.double().amax(-1)[counted]
        frozen[index] = frozen.get(index, torch.zeros(len(thresholds), dtype=torch.float64)) + \
            (top[:, None] > limits[None, :]).sum(0).double()
        rows[index] = rows.get(index, 0) + int(counted.sum())

    ids_NT = torch.as_tensor(ids_NT).long()
    cfg = InspectConfig(str(run_dir), max_tokens=int(ids_NT.shape[-1]), batch=batch, sequences=None, what_ifs=())
    native.inspect(model, ids_NT, cfg, on_layer, None, str(run_dir))
    layers = sorted(frozen)
    by_layer = [(frozen[i] / rows[i]).tolist() for i in layers]
    total = sum(rows[i] for i in layers)
    return {"thresholds": list(thresholds), "by_layer": by_layer,
            "all_layers": (sum(frozen[i] for i in layers) / total).tolist(), "rows": [rows[i] for i in layers],
            "sequences": int(ids_NT.shape[0])}
