import math

import pytest
import torch

from attnscale.core.scales import DISPLAY_NAMES, SCALES, ScoreScale, display_name, get_scale, register_scale


def test_registry_has_the_course_pair_and_the_variants():
    assert {"none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp"} <= set(SCALES)
    assert get_scale("inv_sqrt_d", 64).factor() == pytest.approx(1 / 8)
    assert get_scale("none", 64).factor() == 1.0
    assert get_scale("inv_d", 64).factor() == pytest.approx(1 / 64)
    assert get_scale("learned_temp", 64).factor().item() == pytest.approx(1 / 8)


def test_unknown_scale_names_the_choices():
    with pytest.raises(ValueError, match="unknown scale 'sqrt'.*inv_sqrt_d"):
        get_scale("sqrt", 8)


def test_scaled_unit_variance_scores_have_unit_spread():
    gen = torch.Generator().manual_seed(0)
    for d in (16, 256):
        q, k = torch.randn(4000, d, generator=gen), torch.randn(4000, d, generator=gen)
        assert get_scale("none", d).pair_scores(q, k).std().item() == pytest.approx(math.sqrt(d), rel=0.05)
        assert get_scale("inv_sqrt_d", d).pair_scores(q, k).std().item() == pytest.approx(1.0, rel=0.05)


def test_qk_norm_bounds_scores_whatever_the_magnitude():
    s = get_scale("qk_norm", 32)
    q, k = torch.randn(2, 1, 8, 32) * 1e3, torch.randn(2, 1, 8, 32) * 1e3
    assert s.scores(q, k).abs().max().item() <= math.sqrt(32) + 1e-3


def test_softcap_bounds_scores_and_is_not_fusable():
    s = get_scale("softcap", 4)
    assert s.scores(torch.full((1, 1, 2, 4), 1e3), torch.full((1, 1, 2, 4), 1e3)).max().item() <= 50.0
    assert not s.fusable and get_scale("inv_sqrt_d", 4).fusable


def test_a_new_scheme_is_one_small_class():
    @register_scale("test_half")
    class Half(ScoreScale):
        def factor(self):
            return 0.5

    try:
        assert get_scale("test_half", 3).scores(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3)).item() == 1.5
        assert display_name("test_half") == "test_half"  # no display name given: its own
    finally:
        del SCALES["test_half"], DISPLAY_NAMES["test_half"]


def test_every_scheme_has_one_display_name_that_carries_its_parameter():
    assert set(DISPLAY_NAMES) == set(SCALES)
    assert len(set(DISPLAY_NAMES.values())) == len(DISPLAY_NAMES)  # two schemes never read alike
    assert display_name("inv_sqrt_d") == "1/√d" and display_name("inv_d") == "1/d (muP)"
    assert display_name("softcap") == f"soft-cap {get_scale('softcap', 4).cap_value:g}" == "soft-cap 50"
    assert display_name("a_scheme_from_an_old_record") == "a_scheme_from_an_old_record"
