"""capture/stats: ``pack`` lays a forward's ``HeadSums`` out as one tensor and ``unpack`` reads it back as the
``HeadStats`` every measurement gives; each value checked against float64 by hand (``reference``)."""

import math

import pytest
import torch

from attnscale.capture.reduce import reduce_scores
from attnscale.capture.stats import pack, packed_width, unpack
from attnscale.capture.sums import ROW_MEASURES
from attnscale.core.diagnostics import HEAD_MEASURES
from reference import head_summary


def causal_scores(B, H, T, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, T, T, generator=g) * scale
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)


def test_layers_of_different_widths_pack_and_read_back_as_their_float64_measures():
    layers = [causal_scores(2, 3, 6, seed=0), causal_scores(2, 1, 6, seed=1)]
    sums = [reduce_scores(s) for s in layers]
    parts = pack(sums)
    assert parts.shape == (2, len(HEAD_MEASURES) + 1 + 2 + len(ROW_MEASURES), 3) == (2, packed_width(True), 3)
    assert parts.dtype == torch.float64 and torch.isnan(parts[1, :, 1:]).all()  # the narrow layer's absent heads
    stats = unpack(parts, ("a", "b"), (3, 1))
    assert (stats.layer_names, stats.layer_heads, stats.values_LMH.dtype) == (("a", "b"), (3, 1), torch.float32)
    assert stats.bias_LH2 is None and stats.errors_LRH is None  # no bias here; errors only where asked
    grids = stats.grids()
    for layer, scores in enumerate(layers):
        want = head_summary(scores.double(), torch.softmax(scores.double(), -1))
        for name in HEAD_MEASURES:
            assert grids[name][layer] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (layer, name)
    assert [len(row) for row in grids["spread"]] == [3, 1]  # a head a layer lacks is left out, not NaN
    # each causal row past the first sees two keys or more: 5 rows in each of 2 sequences
    assert stats.rows_LH.tolist() == [[10.0, 10.0, 10.0], [10.0, 0.0, 0.0]]


def test_float64_values_keep_every_digit_and_float32_packing_gives_the_float32_values():
    sums = [reduce_scores(causal_scores(1, 2, 5, seed=2))]
    exact = sums[0].measures()
    wide = unpack(pack(sums), ("l",), (2,), dtype=torch.float64)
    assert torch.equal(wide.values_LMH[0], exact)
    narrow = unpack(pack(sums, torch.float32, errors=False), ("l",), (2,))
    assert pack(sums, torch.float32, errors=False).shape[1] == packed_width(False) == len(HEAD_MEASURES) + 3
    assert torch.equal(narrow.values_LMH[0], exact.float())


def test_standard_errors_are_kept_where_asked_and_equal_the_rows_sample_sd_over_root_n():
    scores = causal_scores(3, 2, 8, seed=3)
    stats = unpack(pack([reduce_scores(scores)]), ("l",), (2,), errors=True)
    p = torch.softmax(scores.double(), -1)
    for r, name in enumerate(ROW_MEASURES):
        for h in range(2):
            # the row measure of each counted row (every row past the first of each sequence), by hand
            per_row = []
            for b in range(3):
                for t in range(1, 8):
                    one = head_summary(scores[b:b + 1, h:h + 1, t:t + 1].double(), p[b:b + 1, h:h + 1, t:t + 1])
                    per_row.append(one[name][0])
            x = torch.tensor(per_row, dtype=torch.float64)
            assert stats.errors_LRH[0, r, h].item() == pytest.approx((x.std() / math.sqrt(len(x))).item(),
                                                                     rel=1e-6, abs=1e-9), (name, h)


def test_grids_read_a_flat_layers_by_width_by_heads_list_leaving_out_heads_a_layer_lacks():
    from attnscale.capture.stats import grids

    # 2 layers, width 3 (two measures, then one row that is no measure), 4 heads wide; layer 1 has 2 heads
    flat = [100 * l + 10 * m + h for l in range(2) for m in range(3) for h in range(4)]
    assert grids(flat, ("a", "b"), (4, 2), 3) == {"a": [[0, 1, 2, 3], [100, 101]], "b": [[10, 11, 12, 13], [110, 111]]}
