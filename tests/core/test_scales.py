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


def _written_out(x, gain, eps=1e-6):
    """qk-norm's formula op by op."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def _qk_norm(gen, fused, monkeypatch):
    """A qk-norm scheme with gains away from 1, on F.rms_norm (as on CUDA) or written out (as on the CPU)."""
    from attnscale.core import scales

    monkeypatch.setattr(scales, "fused_rms_norm", lambda x: fused)
    scheme = get_scale("qk_norm", 64)
    with torch.no_grad():
        scheme.q_gain.uniform_(0.5, 1.5, generator=gen)
        scheme.k_gain.uniform_(0.5, 1.5, generator=gen)
    return scheme


def _q_and_k(gen, dtype):
    """q and k as the model lays them out: B×T×H×D underneath, seen as B×H×T×D."""
    q, k = (3 * torch.randn(2, 5, 2, 64, generator=gen)).to(dtype), torch.randn(2, 5, 2, 64, generator=gen).to(dtype)
    return q.transpose(1, 2).requires_grad_(), k.transpose(1, 2).requires_grad_()


def test_qk_norm_on_f_rms_norm_is_the_formula_written_out_and_so_are_its_gradients(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    scheme = _qk_norm(gen, True, monkeypatch)
    q, k = _q_and_k(gen, torch.float32)
    qn, kn = scheme.prepare(q, k)
    gq, gk = scheme.q_gain.detach().clone().requires_grad_(), scheme.k_gain.detach().clone().requires_grad_()
    want_q, want_k = _written_out(q, gq), _written_out(k, gk)
    torch.testing.assert_close(qn, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kn, want_k, rtol=1e-6, atol=1e-6)
    up = torch.randn(2, 2, 5, 64, generator=gen)
    got = torch.autograd.grad((qn * up).sum() + (kn * up).sum(), (q, k, scheme.q_gain, scheme.k_gain))
    want = torch.autograd.grad((want_q * up).sum() + (want_k * up).sum(), (q, k, gq, gk))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_qk_norm_on_f_rms_norm_takes_a_bf16_q_under_autocast_to_fp32(monkeypatch):
    """Under autocast q and k leave their projections in bf16 and the gains stay fp32: the result is fp32, as the
    written-out product's is, but normalised in fp32 (the written-out mean square is taken in bf16, about 1e-2
    off here); the gradients are float64's to bf16's precision."""
    gen = torch.Generator().manual_seed(0)
    scheme = _qk_norm(gen, True, monkeypatch)
    q, k = _q_and_k(gen, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qn, kn = scheme.prepare(q, k)
        old = _written_out(q, scheme.q_gain)
    q64, gq64 = q.detach().double().requires_grad_(), scheme.q_gain.detach().double().requires_grad_()
    want = _written_out(q64, gq64)
    assert qn.dtype == kn.dtype == old.dtype == torch.float32
    assert (qn.double() - want).abs().max() < 1e-5 < 1e-3 < (old.double() - want).abs().max()
    torch.testing.assert_close(kn.double(), _written_out(k.detach().double(), scheme.k_gain.detach().double()),
                               rtol=1e-5, atol=1e-5)
    up = torch.randn(2, 2, 5, 64, generator=gen)
    got_q, got_g = torch.autograd.grad((qn * up).sum(), (q, scheme.q_gain))
    want_q, want_g = torch.autograd.grad((want * up.double()).sum(), (q64, gq64))
    assert got_q.dtype == torch.bfloat16
    torch.testing.assert_close(got_q.double(), want_q, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got_g.double(), want_g, rtol=1e-5, atol=1e-4)


def test_qk_norm_on_the_cpu_is_written_out_and_keeps_qs_layout():
    """F.rms_norm on the CPU returns a contiguous tensor: the product after it would sum in another order than
    the runs trained so far, and change an fp32 run's bits. Written out, q' keeps q's layout, and its numbers."""
    from attnscale.core import scales

    gen = torch.Generator().manual_seed(0)
    q, k = _q_and_k(gen, torch.float32)
    assert not scales.fused_rms_norm(q)
    scheme = get_scale("qk_norm", 64)
    with torch.no_grad():
        scheme.q_gain.uniform_(0.5, 1.5, generator=gen)
    qn, kn = scheme.prepare(q, k)
    assert qn.stride() == q.stride() and kn.stride() == k.stride()
    assert torch.equal(qn, _written_out(q, scheme.q_gain)) and torch.equal(kn, _written_out(k, scheme.k_gain))


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
