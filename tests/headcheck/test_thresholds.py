"""headcheck.thresholds: the frozen share at several thresholds from a run's final weights, checked by hand."""


import pytest
import torch

from attnscale.headcheck.thresholds import THRESHOLDS, frozen_by_threshold

from run_folders import _cfg, _run_dir  # the run folder a finished run leaves


def test_shares_by_threshold_match_the_weights_recomputed_by_hand(tmp_path):
    cfg = _cfg(scale="none", init="unit")  # unscaled, unit init: many rows near frozen, some not
    model = _run_dir(tmp_path / "run", cfg).float().eval()
    ids = torch.randint(0, 50, (6, 32), generator=torch.Generator().manual_seed(3))
    got = frozen_by_threshold(tmp_path / "run", ids)
    assert got["thresholds"] == list(THRESHOLDS) and got["sequences"] == 6
    # by hand: the model's own attention weights through its hooks, rows that see 2 keys or more (rows 1 … 31)
    from attnscale.core.hooks import hooked

    with hooked(model) as cache, torch.no_grad():
        model(ids)
    patterns = [v for k, v in sorted(cache.items()) if k.endswith("hook_pattern")]
    assert len(patterns) == len(got["by_layer"]) == 2
    for pattern, shares, rows in zip(patterns, got["by_layer"], got["rows"]):
        top = pattern[:, :, 1:, :].amax(-1).flatten().double()  # row 0 sees one key: not counted
        assert rows == top.numel() == 6 * cfg.n_heads * 31
        assert shares == pytest.approx([float((top > t).double().mean()) for t in THRESHOLDS], abs=1e-12)
        assert shares == sorted(shares, reverse=True)  # a higher line never freezes more rows
    assert 0 < got["all_layers"][0] and got["all_layers"][-1] < 1
