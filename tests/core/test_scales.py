import math

import pytest
import torch

from attnscale.core.scales import DISPLAY_NAMES, SCALES, ScoreScale, check_scale, display_name, get_scale, register_scale
from attnscale.errors import ConfigError


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
        assert Half.name == "test_half" and get_scale("test_half", 3).name == "test_half"  # it knows its name
    finally:
        del SCALES["test_half"], DISPLAY_NAMES["test_half"]


def test_every_scheme_has_one_display_name_that_carries_its_parameter():
    assert set(DISPLAY_NAMES) == set(SCALES)
    assert len(set(DISPLAY_NAMES.values())) == len(DISPLAY_NAMES)  # two schemes never read alike
    assert display_name("inv_sqrt_d") == "1/√d" and display_name("inv_d") == "1/d (muP)"
    assert display_name("softcap") == f"soft-cap {get_scale('softcap', 4).cap_value:g}" == "soft-cap 50"
    assert display_name("a_scheme_from_an_old_record") == "a_scheme_from_an_old_record"


def test_the_registry_lists_the_schemes_in_order_under_their_names():
    from attnscale.core.scales import scale_names

    names = ["none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp"]
    assert scale_names() == names
    assert [get_scale(n, 4).name for n in names] == names  # every result records the scale by name
    with pytest.raises(ValueError, match="^scale 'inv_d' is already registered$"):
        register_scale("inv_d")(type("Again", (ScoreScale,), {}))


def test_qk_norm_normalises_each_vector_over_its_own_head_dim():
    # q and k at any size along T and H, all parallel to the ones vector: each normalises to ones
    # (length sqrt(16) = 4), so every score is 16 × 1/sqrt(16) = 4, whatever the sizes
    d = 16
    sizes_q = torch.tensor([0.5, 2.0, 7.0]).view(1, 1, 3, 1) * torch.tensor([1.0, 3.0]).view(1, 2, 1, 1)
    sizes_k = torch.tensor([0.75, 5.0, 1.5]).view(1, 1, 3, 1)
    q, k = sizes_q * torch.ones(1, 2, 3, d), sizes_k * torch.ones(1, 2, 3, d)
    with torch.no_grad():
        scheme = get_scale("qk_norm", d)
        torch.testing.assert_close(scheme.scores(q, k), torch.full((1, 2, 3, 3), 4.0), rtol=1e-4, atol=0)
        # the learned gains multiply q' and k': gains 2 and 3 give 4 × 6
        scheme.q_gain.fill_(2.0)
        scheme.k_gain.fill_(3.0)
        torch.testing.assert_close(scheme.scores(q, k), torch.full((1, 2, 3, 3), 24.0), rtol=1e-4, atol=0)


def test_qk_norm_adds_its_epsilon_to_the_mean_square():
    # entries 1e-3: mean square 1e-6, plus eps 1e-6: each entry becomes 1e-3 / sqrt(2e-6) = 1/sqrt(2)
    scheme = get_scale("qk_norm", 4)
    with torch.no_grad():
        q_n, _ = scheme.prepare(torch.full((1, 4), 1e-3), torch.ones(1, 4))
    torch.testing.assert_close(q_n, torch.full((1, 4), 1 / math.sqrt(2)), rtol=1e-5, atol=0)


def test_a_head_dim_must_be_positive_and_one_is_enough():
    assert get_scale("none", 1).head_dim == 1 and get_scale("inv_sqrt_d", 1).factor() == 1.0
    with pytest.raises(ValueError, match="^head_dim must be a positive integer, got 0$"):
        get_scale("none", 0)
    with pytest.raises(ValueError, match="^unknown scale 'sqrt'; choose one of: none, inv_sqrt_d, inv_d, qk_norm, softcap, learned_temp, uniform$"):
        get_scale("sqrt", 8)


def test_scores_are_every_query_against_every_key():
    # B 2, H 3, 4 queries, 5 keys, width 6: scores[b, h, i, j] = q[b, h, i] · k[b, h, j] / sqrt(6)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 4, 6, generator=g), torch.randn(2, 3, 5, 6, generator=g)
    expected = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(6)
    torch.testing.assert_close(get_scale("inv_sqrt_d", 6).scores(q, k), expected)


def test_one_rule_names_a_scheme_before_any_is_built():
    assert [check_scale(s) for s in SCALES] == list(SCALES)
    with pytest.raises(ConfigError, match="unknown scale 'inv_sqrtd'; choose one of: none, inv_sqrt_d"):
        check_scale("inv_sqrtd")
    with pytest.raises(ConfigError, match="unknown scale 'inv_sqrtd'"):
        get_scale("inv_sqrtd", 64)


def test_a_scale_registered_at_run_time_is_listed_under_its_name_with_its_words_and_floor(monkeypatch):
    from attnscale.core import scales

    for table in ("SCALES", "DISPLAY_NAMES", "FLOORS"):  # the registry as it was, restored after the test
        monkeypatch.setattr(scales, table, type(getattr(scales, table))(getattr(scales, table)))

    @scales.register_scale("test_half", display="half the product", floor=True)
    class Half(scales.ScoreScale):
        def factor(self):
            return 0.5

    @scales.register_scale("test_plain")
    class Plain(scales.ScoreScale):
        def factor(self):
            return 1.0

    assert scales.SCALES["test_half"] is Half and Half.name == "test_half" and Plain.name == "test_plain"
    assert scales.DISPLAY_NAMES["test_half"] == "half the product" and scales.DISPLAY_NAMES["test_plain"] == "test_plain"
    assert "test_half" in scales.FLOORS and "test_plain" not in scales.FLOORS and None not in scales.FLOORS
    assert scales.get_scale("test_half", 4).factor() == 0.5
    with pytest.raises(ValueError, match="^scale 'test_half' is already registered$"):
        scales.register_scale("test_half")(Plain)
