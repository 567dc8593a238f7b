"""The ``uniform`` floor: attention that weighs every visible key equally, whatever q and k."""

import torch

from attnscale import Attention
from attnscale.core.attention import attend, build_mask
from attnscale.core.scales import FLOORS, get_scale, scale_names

torch.set_num_threads(1)


def _by_hand(v_BHTD: torch.Tensor, visible_BTT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights 1/n over the n visible keys and the mean of their v's, in float64, row by row."""
    B, H, T, D = v_BHTD.shape
    weights = torch.zeros(B, H, T, T, dtype=torch.float64)
    out = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for i in range(T):
            seen = [j for j in range(T) if visible_BTT[b, i, j]]
            for j in seen:
                weights[b, :, i, j] = 1.0 / len(seen)
            if seen:
                out[b, :, i] = sum(v_BHTD[b, :, j].double() for j in seen) / len(seen)
    return weights, out


def test_causal_weights_are_the_plain_average_of_the_visible_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) * 50 for _ in range(3))  # large q·k changes nothing
    z, scores, pattern = attend(q, k, v, get_scale("uniform", 8), build_mask(6, causal=True))
    visible = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 6, 6)
    weights, out = _by_hand(v, visible)
    torch.testing.assert_close(pattern.double(), weights, rtol=0, atol=1e-7)
    torch.testing.assert_close(z.double(), out, rtol=0, atol=1e-5)
    assert pattern[0, 0, 3, :4].tolist() == [0.25] * 4 and pattern[0, 0, 3, 4:].tolist() == [0.0, 0.0]


def test_padded_weights_skip_the_padding_and_empty_rows_stay_zero():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    keep = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    z, _, pattern = attend(q, k, v, get_scale("uniform", 4), build_mask(5, causal=False, key_padding_BT=keep))
    weights, out = _by_hand(v, keep[:, None, :].expand(2, 5, 5))
    torch.testing.assert_close(pattern.double(), weights, rtol=0, atol=1e-7)
    torch.testing.assert_close(z.double(), out, rtol=0, atol=1e-6)
    torch.testing.assert_close(pattern[0, 0, 0], torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3, 0.0]))
    assert pattern[1].eq(0).all() and z[1].eq(0).all()


def test_infinite_products_do_not_make_nan_and_the_model_never_takes_sdpa():
    s = get_scale("uniform", 4)
    q = torch.full((1, 1, 3, 4), float("inf"))
    assert s.scores(q, q).eq(0).all() and s.pair_scores(q[0, 0], q[0, 0]).eq(0).all()
    assert not s.fusable and s.factor() == 0.0
    attn = Attention(8, 2, 4, scale="uniform", impl="fused")
    x = torch.randn(1, 5, 8)
    got = attn(x)
    # the output is o_proj of the running mean of the v's: written out from the projections
    v = attn.v_proj(x).view(1, 5, 2, 4).transpose(1, 2)
    mean = torch.cumsum(v, dim=2) / torch.arange(1, 6).view(1, 1, 5, 1)
    torch.testing.assert_close(got, attn.o_proj(mean.transpose(1, 2).reshape(1, 5, 8)), rtol=1e-5, atol=1e-6)


def test_the_floor_is_registered_but_left_out_of_every_scheme_study():
    assert "uniform" in FLOORS and "uniform" in scale_names(floors=True)
    assert "uniform" not in scale_names() and "none" in scale_names()


def test_uniform_scores_have_the_shapes_of_every_scales_scores():
    """All zeros, shaped as the unscaled scores are: (B, H, T, S) for a call (and without its leading dims),
    one per broadcast pair."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    s, plain = get_scale("uniform", 4), get_scale("none", 4)
    assert s.scores(q, k).shape == plain.scores(q, k).shape == (2, 3, 5, 7) and not s.scores(q, k).any()
    for q_, k_ in ((q[0], k[0]), (q[0, 0], k[0, 0])):  # a head's rows and keys, without the batch or the heads
        assert s.scores(q_, k_).shape == plain.scores(q_, k_).shape == (*q_.shape[:-1], 7) and not s.scores(q_, k_).any()
    for q_ND, k_ND in ((q[0, 0], q[1, 0]), (q[0, 0], k[0, 0, :1]), (q[0, 0, :1], q[0, 0]), (q, q)):
        got = s.pair_scores(q_ND, k_ND)
        assert got.shape == plain.pair_scores(q_ND, k_ND).shape and not got.any()
