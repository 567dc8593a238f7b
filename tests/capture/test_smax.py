"""capture.smax: the bfloat16 screen of QK-Clip's S_max, its error bound and the rows it leaves to float32.

Every largest |score| here is checked against every score in float64, written out in this file; head_max's
cases (causal, windowed, padded, GQA, capped, bottom-right) run through both routes in test_reduce.py."""

import math

import pytest
import torch

from attnscale.capture import smax
from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import tiled


def _exact_rows(q, k, visible=None):
    """Each row's largest |q·kᵀ| over its visible keys, every score in float64 (B×H×T)."""
    k = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.double() @ k.mT).abs()
    return (s if visible is None else s.masked_fill(~visible, 0)).amax(-1)


def _screen_parts(call):
    q, k, _, _ = tiled(call, None)
    return q, k, *smax.approximate_rows(call, q, k)


def _rounding_up(shape):
    """Entries that bfloat16 rounds up by nearly its whole unit roundoff: 1 + 2⁻⁸ + 2⁻²⁰ becomes 1 + 2⁻⁷."""
    return torch.full(shape, 1 + 2.0 ** -8 + 2.0 ** -20)


def _cases():
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 4, 40, 64
    heavy = torch.randn(B, H, T, D, generator=g) * torch.exp(3 * torch.randn(B, H, T, 1, generator=g))
    yield "normal", torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    yield "heavy-tailed rows", heavy, torch.randn(B, H, T, D, generator=g)
    yield "tiny (under bfloat16's normal range)", torch.randn(B, H, T, D, generator=g) * 1e-39, torch.randn(
        B, H, T, D, generator=g)
    # the same random sign on q's and k's entry d: every product positive, every rounding error the same way
    signs = torch.randint(0, 2, (1, 1, 1, 256), generator=g) * 2.0 - 1
    yield "every entry rounded up by ~u, D = 256", _rounding_up((1, 2, 8, 256)) * signs, _rounding_up(
        (1, 2, 8, 256)) * signs


@pytest.mark.parametrize("name,q,k", list(_cases()), ids=[c[0] for c in _cases()])
def test_each_rows_bfloat16_largest_score_is_within_its_bound_of_the_float64_one(name, q, k):
    call = AttentionCall(q, k, is_causal=True)
    _, _, approx, eps = _screen_parts(call)
    T = q.shape[-2]
    want = _exact_rows(q, k, torch.ones(T, T, dtype=torch.bool).tril())
    err = (approx.double() - want).abs()
    assert bool((err <= eps.double()).all()), float((err / eps.double()).max())
    if name.startswith("every entry"):
        # the bound is nearly reached where every rounding goes one way: half of C would not hold here
        assert float((err / eps.double()).max()) > 0.6


def test_near_ties_under_bfloat16s_resolution_give_the_float32_max_of_the_right_row():
    """Twelve rows of head 1 score 92.75 ± 0.01 at key 40 (a midpoint of bfloat16's grid, spaced 0.5 there), in
    random directions otherwise, so that the row bfloat16 ranks first is not the one float64 ranks first: every
    row within the bound is made again in float32, which picks the right one; a screen that trusted its own
    ranking would give a smaller number."""
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 2, 128, 32, generator=g), torch.randn(1, 2, 128, 32, generator=g)
    rows = torch.arange(50, 62)
    key = k[0, 1, 40].double()
    unit = key / key.norm()
    other = torch.randn(12, 32, generator=g, dtype=torch.float64)
    other = other - (other @ unit)[:, None] * unit  # orthogonal to the key: no part of the score
    target = 92.75 + 0.01 * (2 * torch.rand(12, 1, generator=g, dtype=torch.float64) - 1)
    q[0, 1, rows] = (unit * target / key.norm() + 8 * other / other.norm(dim=1, keepdim=True)).float()
    call = AttentionCall(q, k, is_causal=True)
    qt, kt, approx, eps = _screen_parts(call)
    exact = _exact_rows(q, k, torch.ones(128, 128, dtype=torch.bool).tril())
    # the case is the one meant: bfloat16's first rows do not hold float64's first
    first = int(exact[0, 1].argmax())
    assert first not in (approx[0, 1] == approx[0, 1].max()).nonzero().flatten().tolist()
    got = smax.screened(call, qt, kt)
    assert got is not None  # the screen ran: these rows were left in, not every row
    torch.testing.assert_close(got.double(), exact.amax((0, 2)), rtol=2e-7, atol=0)
    floor = float((approx - eps)[0, 1].max())
    left = ((approx + eps)[0, 1] >= floor).nonzero().flatten().tolist()
    assert first in left and set(left) <= set(rows.tolist())


def test_a_non_finite_visible_score_or_a_tie_everywhere_is_left_to_float32(monkeypatch):
    monkeypatch.setattr(smax, "SCREEN", True)
    monkeypatch.setattr(smax, "SCREEN_FROM", 0)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 16, 8, generator=g), torch.randn(1, 2, 16, 8, generator=g)
    k[0, 0, 3] = math.inf  # seen by rows 3 on of head 0
    call = AttentionCall(q, k, is_causal=True)
    assert smax.screened(call, *tiled(call, None)[:2]) is None
    got = smax.head_max(call)
    assert math.isinf(float(got[0])) or math.isnan(float(got[0]))
    assert math.isfinite(float(got[1]))
    zero = AttentionCall(torch.zeros(1, 2, 16, 8), k.nan_to_num(posinf=1.0), is_causal=True)
    assert smax.screened(zero, *tiled(zero, None)[:2]) is None  # every row ties at 0: all left in
    assert smax.head_max(zero).tolist() == [0.0, 0.0]


def test_a_padded_gqa_call_screened_is_the_float64_max():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 48, 16, generator=g) * 2, torch.randn(2, 2, 48, 16, generator=g)
    pad = torch.ones(2, 48, dtype=torch.bool)
    pad[1, 30:] = False
    q[1, :, 35] = math.nan  # a padded row's NaN and a padded key's inf are no score
    k[1, :, 40] = math.inf
    call = AttentionCall(q, k, is_causal=True, window=9)
    qt, kt, _, _ = tiled(call, pad)
    got = smax.screened(call, qt, kt)
    assert got is not None
    i, j = torch.arange(48)[:, None], torch.arange(48)[None, :]
    visible = (j <= i) & (j > i - 9) & pad[:, None, None, :] & pad[:, None, :, None]
    want = _exact_rows(q.nan_to_num(0.0).masked_fill(~pad[:, None, :, None], 0),
                       k.masked_fill(~pad[:, None, :, None], 0), visible).amax((0, 2))
    torch.testing.assert_close(got.double(), want, rtol=2e-7, atol=0)


def test_a_bottom_right_causal_call_with_more_keys_than_rows_screened_is_the_float64_max():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 4, 20, 16, generator=g), torch.randn(2, 2, 48, 16, generator=g)
    call = AttentionCall(q, k, is_causal=True, diagonal=28, window=30)
    got = smax.screened(call, *tiled(call, None)[:2], memory=4 * 20 * 48 * 16)  # a few rows a block
    assert got is not None
    i, j = torch.arange(20)[:, None] + 28, torch.arange(48)[None, :]
    torch.testing.assert_close(got.double(), _exact_rows(q, k, (j <= i) & (j > i - 30)).amax((0, 2)), rtol=2e-7, atol=0)


def test_the_screen_runs_on_a_cpu_from_its_size_on_and_never_on_another_device(monkeypatch):
    q, k = torch.zeros(1, 2, 64, 8), torch.zeros(1, 2, 64, 8)
    monkeypatch.setattr(smax, "SCREEN", True)
    monkeypatch.setattr(smax, "SCREEN_FROM", 2 * 64 * 64)
    assert smax._screen(q, k)
    assert not smax._screen(q[:, :, :63], k)
    assert not smax._screen(q.to("meta"), k.to("meta"))
    monkeypatch.setattr(smax, "SCREEN", False)
    assert not smax._screen(q, k)
    monkeypatch.setattr(smax, "SCREEN", None)
    assert smax._screen(q, k) == smax.bf16_arithmetic()


@pytest.mark.parametrize("window", [None, 5])
def test_q_and_k_as_a_model_lays_them_out_give_the_float64_max_one_head_at_a_time(window):
    """B×T×H×D underneath (the layout of a projection's output, transposed), GQA: each query head's product
    reads its strided rows as they are; every head against float64, padding and a window included."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 20, 4, 8, generator=g).transpose(1, 2)
    k = torch.randn(3, 20, 2, 8, generator=g).transpose(1, 2)
    pad = torch.ones(3, 20, dtype=torch.bool)
    pad[2, 14:] = False
    assert not q.is_contiguous()
    got = smax.head_max(AttentionCall(q, k, scale=0.3, is_causal=True, window=window), padding_BT=pad)
    i, j = torch.arange(20)[:, None], torch.arange(20)[None, :]
    visible = (j <= i) & ((j > i - window) if window else True) & pad[:, None, None, :] & pad[:, None, :, None]
    want = _exact_rows(q, k, visible).amax((0, 2)) * 0.3
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)  # float32's product, then its factor


def test_rows_that_see_no_key_count_for_nothing_whatever_they_hold(monkeypatch):
    """Bottom-right causal with more rows than keys: rows 0-15 see no key. Rows there a thousand times longer than
    the rest (whose bound alone leaves them in), and then a NaN there, change no head's max, by either route."""
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 2, 40, 16, generator=g), torch.randn(1, 2, 24, 16, generator=g)
    q[0, :, :4] *= 1000
    i, j = torch.arange(40)[:, None] - 16, torch.arange(24)[None, :]
    want = _exact_rows(q, k, j <= i).amax((0, 2)) * 0.25
    call = AttentionCall(q, k, is_causal=True, diagonal=-16)
    qt, kt, approx, eps = _screen_parts(call)
    floor = (approx - eps).amax(dim=(0, 2))
    assert bool(((approx + eps)[0, :, :4] >= floor[:, None]).all())  # the long rows are left in
    for memory in (smax.DEFAULT_MEMORY, 8 * 24):  # the rows made again all at once, and one at a time
        torch.testing.assert_close(smax.screened(call, qt, kt, memory).double() * 0.25, want, rtol=1e-6, atol=0)
    q[0, 1, 3] = math.nan
    monkeypatch.setattr(smax, "SCREEN_FROM", 0)
    for screen in (False, True):
        monkeypatch.setattr(smax, "SCREEN", screen)
        got = smax.head_max(AttentionCall(q, k, is_causal=True, diagonal=-16))
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
