"""How much of a record reaches the loggers: every head, a line per layer, or the model in a few numbers.

``detail`` (on ``Watch``, both callbacks, and each scalar sink):

- ``"heads"`` (the default): ``attn/layer_{l}/head_{h}/{measure}`` for every layer, head and measure;
- ``"layers"``: ``attn/layer_{l}/{measure}``, each measure over the layer's heads as fits it
  (``LAYER_REDUCTIONS``): the largest max_score, the fewest effective_words, the frozen share of all the
  layer's rows (frozen_fraction weighted by each head's rows) and the mean over heads of spread, push and
  max_weight; a bias range as its smallest bias_min and largest bias_max, QK-Clip's smallest gamma and largest
  s_max;
- ``"summary"``: the model-wide ``attn/...`` summaries only (and ``qk_clip/...``'s and the watch's own).

A model of 80 layers of 64 heads makes 30,720 head scalars a probe; per layer, 480. The JSONL log keeps every
head whatever the detail: ``attnscale watch-report`` reads it, and any layer's heads can be looked up there.
"""

from __future__ import annotations

from attnscale.capture.options import DETAILS, check_detail
from attnscale.core.diagnostics import reduce_heads
from attnscale.watch.logs.line import WatchLine

__all__ = ["DETAILS", "LAYER_REDUCTIONS", "check_detail", "layer_table"]

# measure -> how a layer's heads become one number; "rows": the mean weighted by the rows each head counted
LAYER_REDUCTIONS = {"max_score": "max", "effective_words": "min", "frozen_fraction": "rows", "bias_min": "min",
                    "bias_max": "max", "gamma": "min", "s_max": "max"}


def _present(x):
    """A number, or None where it is missing or NaN (what ``reduce_heads`` leaves out)."""
    return None if x is None or x != x else float(x)


def per_layer(measure: str, grid_LH: list, rows_LH: list | None = None) -> list[float]:
    """One number per layer from a [layer][head] grid, reduced as ``LAYER_REDUCTIONS`` says (the mean else);
    NaN for a layer with no value."""
    how = LAYER_REDUCTIONS.get(measure, "mean")
    grid = [[_present(v) for v in layer] for layer in grid_LH]
    if how == "rows":
        return reduce_heads(grid, "mean", per_layer=True, weights_LH=rows_LH)
    return reduce_heads(grid, how, per_layer=True)


def layer_table(record: WatchLine) -> list[list[float]]:
    """[layer][measure]: each measure of ``record`` over each layer's heads (``per_layer``)."""
    columns = [per_layer(m, record.grid(m), record.rows) for m in record.measures]
    return [list(row) for row in zip(*columns)]
