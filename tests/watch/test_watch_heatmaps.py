"""watch.logs.heatmaps: a layer × head grid as an image, on a fixed colour ramp, and the measures drawn."""

import numpy as np
import pytest

from attnscale.watch.logs.heatmaps import RAMP, heatmap, image_measures


def test_a_heatmap_puts_layers_down_and_heads_across_on_viridis():
    grid = [[0.0, 1.0, 2.0], [None, 3.0, 4.0]]
    image, lo, hi = heatmap(grid, "max_score")
    assert image.shape == (2 * 16, 3 * 16, 3) and image.dtype == np.uint8 and (lo, hi) == (0.0, 4.0)
    cell = lambda layer, head: tuple(image[16 * layer + 8, 16 * head + 8])  # noqa: E731
    assert cell(0, 0) == tuple(RAMP[0]) and cell(1, 2) == tuple(RAMP[4]) and cell(0, 2) == tuple(RAMP[2])
    assert cell(1, 0) == (255, 255, 255)  # no value
    assert cell(0, 1) == tuple(RAMP[1])  # a quarter of the way: the second of the ramp's five colours
    between, _, _ = heatmap([[0.0, 0.5, 4.0]], "max_score")
    assert tuple(between[8, 24]) == tuple(np.rint((RAMP[0] + RAMP[1]) / 2))  # an eighth: halfway between the two
    fixed, lo, hi = heatmap([[0.5, 1.0]], "frozen_fraction")  # a share spans 0 to 1 whatever the probe holds
    assert (lo, hi) == (0.0, 1.0) and tuple(fixed[0, 0]) == tuple(RAMP[2])
    assert image_measures(True) == ("max_score", "effective_words", "frozen_fraction") and image_measures(False) == ()
    with pytest.raises(ValueError, match="images takes"):
        image_measures(["entropy"])
