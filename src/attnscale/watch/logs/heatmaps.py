"""A probe's layer × head heatmaps, as RGB arrays a logger takes as images (no matplotlib).

One image per measure: a row of cells per layer (layer 0 on top), a column per head (head 0 on the left),
coloured on viridis's ramp, dark for the smallest value and yellow for the largest; white where a head has
no value. The ramp spans the measure's own bounds where it has them (frozen_fraction and max_weight: 0 to 1),
else the probe's smallest to largest value, so those images are read against each other only by pattern: the
scalars, and the caption W&B shows, carry the numbers. ``TensorBoardSink(images=True)`` and
``WandbSink(images=True)`` log them at each probe (``attn/heatmap/{measure}``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.errors import ConfigError

__all__ = ["IMAGE_MEASURES", "heatmap", "image_measures"]

IMAGE_MEASURES = ("max_score", "effective_words", "frozen_fraction")  # what images=True draws
BOUNDS = {"frozen_fraction": (0.0, 1.0), "max_weight": (0.0, 1.0)}
# viridis at 0, 1/4, 1/2, 3/4 and 1, linearly between
RAMP = np.array([(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)], dtype=np.float64)
MISSING = (255, 255, 255)
LARGEST = 1024  # pixels along the longer side, at most (cells of 1 to 16 pixels)


def image_measures(images: bool | Sequence[str]) -> tuple[str, ...]:
    """The measures an ``images=`` option draws: True for ``IMAGE_MEASURES``, False for none, or the names."""
    if isinstance(images, bool):
        return IMAGE_MEASURES if images else ()
    names = (images,) if isinstance(images, str) else tuple(images) if isinstance(images, (list, tuple)) else (images,)
    unknown = [m for m in names if not isinstance(m, str) or m not in HEAD_MEASURES]
    if unknown:
        raise ConfigError(f"images takes True, False or measures among {', '.join(HEAD_MEASURES)}, got {unknown[0]!r}")
    return names


def heatmap(grid_LH: list, measure: str) -> tuple[np.ndarray, float, float]:
    """(the image, uint8 of shape (pixels down, pixels across, 3); the value of the darkest colour; of the
    brightest) of one measure's [layer][head] grid (None or NaN: no value)."""
    values = np.array([[math.nan if v is None else float(v) for v in layer] for layer in grid_LH], dtype=np.float64)
    finite = np.isfinite(values)
    if measure in BOUNDS:
        lo, hi = BOUNDS[measure]
    else:
        lo, hi = (float(values[finite].min()), float(values[finite].max())) if finite.any() else (0.0, 1.0)
    share = np.clip((values - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.full(values.shape, 0.5)
    at = np.where(finite, share, 0.0) * (len(RAMP) - 1)
    low = np.minimum(at.astype(int), len(RAMP) - 2)
    frac = (at - low)[..., None]
    rgb = RAMP[low] * (1 - frac) + RAMP[low + 1] * frac
    rgb[~finite] = MISSING
    cell = max(1, min(16, LARGEST // max(values.shape)))
    image = np.repeat(np.repeat(np.rint(rgb).astype(np.uint8), cell, axis=0), cell, axis=1)
    return image, lo, hi
