"""The learning-rate study's figure: drawn from a block's groups alone, a panel per group; no group refused."""

import pytest

from attnscale.errors import ConfigError
from attnscale.report.lr_plots import TREATMENT_COLOURS, loss_against_rate


def _group(optimizer, interim=False):
    def curve(losses, failed=()):
        per = [{"lr": lr, "mean": min(sum(v for v in ls if v is not None) / len(ls), 2.27) if None not in ls else 2.27,
                "losses": dict(enumerate(ls)), "failed_seeds": [1] if lr in failed else []}
               for lr, ls in losses.items()]
        return {"floor": 2.27, "seeds": [0, 1], "per_rate": per}

    return {"optimizer": optimizer, "d_model": 64, "interim": interim,
            "curves": {"none": curve({1e-2: [1.55, 1.56], 4e-2: [1.70, None]}, failed=(4e-2,)),
                       "qk-norm": curve({1e-2: [1.52, 1.53], 4e-2: [1.54, 1.55]})}}


def test_a_panel_per_group(tmp_path):
    import matplotlib.image

    one = loss_against_rate([_group("adamw")], tmp_path / "one.png")
    two = loss_against_rate([_group("adamw"), _group("muon", interim=True)], tmp_path / "two.png")
    w1, w2 = (matplotlib.image.imread(p).shape[1] for p in (one, two))
    assert w2 > 1.8 * w1  # the second panel beside the first


def test_every_treatment_has_its_colour():
    from attnscale.experiments.lr_study import TREATMENTS

    assert set(TREATMENT_COLOURS) == set(TREATMENTS) and len(set(TREATMENT_COLOURS.values())) == len(TREATMENTS)


def test_nothing_to_draw_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no finished lr-study group"):
        loss_against_rate([], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
