"""capture.sums: the spread merged block by block keeps its digits however large the scores' mean.

Scores here are whole numbers (q and k of small integers, one coordinate carrying the mean), so float32
holds every score exactly and the reference, the population standard deviation of the same numbers in
float64 written out here, is exact to float64. One sequence, causal, several heads, at mean/spread 10³
and 10⁴, in blocks from one row of one head to the whole call."""

import math

import pytest
import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import BYTES_PER_ENTRY, reduce_call, reduce_scores
from attnscale.capture.sums import HeadSums

H, T, D_ = 3, 24, 6


def _qk(mean: float, seed=0):
    """Scores q·k = mean·(1 + h/10) + Σ small products: spread about 5, mean as asked (head h a little more)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-2, 3, (1, H, T, D_), generator=g).float()
    k = torch.randint(-2, 3, (1, H, T, D_), generator=g).float()
    q[..., 0] = torch.tensor([round(mean * (1 + h / 10)) for h in range(H)]).view(1, H, 1).float()
    k[..., 0] = 1.0
    return q, k


def _spread_and_mean(vals: list[float]) -> tuple[float, float]:
    """The population standard deviation and the mean of ``vals``, in float64 with exact sums (fsum)."""
    m = math.fsum(vals) / len(vals)
    return math.sqrt(math.fsum((v - m) ** 2 for v in vals) / len(vals)), m


def _by_hand(q, k):
    """Per head: (population spread, largest |score|, mean) over the causal scores, in float64 from the numbers."""
    out = []
    for h in range(H):
        vals = [sum(float(a) * float(b) for a, b in zip(q[0, h, i], k[0, h, j])) for i in range(T) for j in range(i + 1)]
        spread, m = _spread_and_mean(vals)
        out.append((spread, max(abs(v) for v in vals), m))
    return out


BUDGETS = (1, 5 * H * T * BYTES_PER_ENTRY, 256 << 20)  # a row of one head, five rows of every head, everything


@pytest.mark.parametrize("ratio", [1e3, 1e4])
@pytest.mark.parametrize("memory", BUDGETS)
def test_a_large_mean_costs_the_spread_no_digits(ratio, memory):
    q, k = _qk(5.0 * ratio)
    want = _by_hand(q, k)
    assert all(ratio <= m / s < 1.5 * ratio for s, _, m in want)
    got = reduce_call(AttentionCall(q, k, scale=1.0, is_causal=True), memory=memory).measures()
    assert got[0].tolist() == pytest.approx([s for s, _, _ in want], rel=1e-6)
    assert got[1].tolist() == [t for _, t, _ in want]


@pytest.mark.parametrize("ratio", [1e3, 1e4])
def test_scores_a_model_computed_keep_their_digits_at_a_large_mean(ratio):
    q, k = _qk(5.0 * ratio, seed=1)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf)
    want = _by_hand(q, k)
    for memory in (1, 3 * H * T * BYTES_PER_ENTRY):
        got = reduce_scores(scores, memory=memory).measures()
        assert got[0].tolist() == pytest.approx([s for s, _, _ in want], rel=1e-6)


@pytest.mark.parametrize("ratio", [1e3, 1e4])
def test_sums_merged_from_halves_are_the_whole_at_a_large_mean(ratio):
    """Two halves of the rows, each its own sums (another batch, another rank), merged: the whole call's spread."""
    q, k = _qk(5.0 * ratio, seed=2)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf)
    a, b = HeadSums(H), HeadSums(H)
    a.add_block(scores[:, :, :5], torch.isfinite(scores[:, :, :5]))
    b.add_block(scores[:, :, 5:], torch.isfinite(scores[:, :, 5:]))
    a.merge(b)
    assert a.measures()[0].tolist() == pytest.approx([s for s, _, _ in _by_hand(q, k)], rel=1e-6)
    assert a.entries.tolist() == [T * (T + 1) / 2] * H


def test_blocks_whose_first_row_sees_no_key_keep_their_digits():
    """A block's shift is its first row's mean over the keys it sees; where that row sees none (padding),
    the shift falls to 0 and the block's own deviations must still be exact."""
    q, k = _qk(5e3, seed=3)
    pad = torch.ones(1, T, dtype=torch.bool)
    pad[0, :4] = False  # the first four tokens are padding: no row of them counts, no key of them is seen
    got = reduce_call(AttentionCall(q, k, scale=1.0, is_causal=True), padding_BT=pad, memory=1 << 30).measures()
    want = []
    for h in range(H):
        vals = [sum(float(a) * float(b) for a, b in zip(q[0, h, i], k[0, h, j])) for i in range(4, T) for j in range(4, i + 1)]
        want.append(_spread_and_mean(vals)[0])
    assert got[0].tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("memory", (1 << 30, 3 * H * T * BYTES_PER_ENTRY))
def test_the_shift_is_each_heads_own_first_row_that_sees_a_key(memory):
    """The shift comes from the first row that sees a key in each head, across sequences: here the first
    sequence sees nothing (all padding), and in the second, head h sees only its own key (a row of one key)
    from row 2h on. A shift from a row that sees nothing would be 0, 10⁴ spreads from the scores, and the
    float32 deviations would lose the spread's digits."""
    q1, k1 = _qk(5e4, seed=4)
    q, k = torch.cat([q1.flip(2), q1]), torch.cat([k1.flip(2), k1])  # two sequences
    i = torch.arange(T)
    visible = torch.zeros(2, H, T, T, dtype=torch.bool)
    for h in range(H):
        visible[1, h, i[2 * h:], i[2 * h:]] = True
    got = reduce_call(AttentionCall(q, k, scale=1.0, mask=visible), memory=memory).measures()
    want = []
    for h in range(H):
        vals = [sum(float(a) * float(b) for a, b in zip(q[1, h, t], k[1, h, t])) for t in range(2 * h, T)]
        spread, m = _spread_and_mean(vals)
        assert m / spread > 1e3  # a large mean
        want.append(spread)
    assert got[0].tolist() == pytest.approx(want, rel=1e-6)


def test_each_row_measure_keeps_its_own_rows_through_merge_and_standard_errors():
    """Effective words over four rows, max weight over two (as the fused route adds them): each mean and standard
    error over its own rows, by hand; a merge adds rows to rows."""
    words, weights = [1.0, 2.0, 4.0, 5.0], [0.5, 0.9]
    sums = HeadSums(1)
    sums.add_rows("effective_words", torch.tensor(words, dtype=torch.float64).view(1, 1, 4), torch.ones(1, 1, 4, dtype=torch.bool))
    sums.add_rows("max_weight", torch.tensor(weights + [math.nan], dtype=torch.float64).view(1, 1, 3),
                  torch.tensor([True, True, False]).view(1, 1, 3))  # a row not counted may hold anything
    def by_hand(v):
        m = sum(v) / len(v)
        return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))
    got, errors = sums.measures()[:, 0].tolist(), sums.standard_errors()[:, 0].tolist()
    assert (got[2], errors[0]) == pytest.approx(by_hand(words), rel=1e-12)
    assert (got[5], errors[3]) == pytest.approx(by_hand(weights), rel=1e-12)
    assert math.isnan(got[3]) and math.isnan(got[4])  # frozen share and push: no row counted
    assert sums.rows.tolist() == [0.0] and sums.rows_effective_words.tolist() == [4.0]
    other = HeadSums(1)
    other.add_rows("effective_words", torch.tensor([7.0]).view(1, 1, 1), torch.ones(1, 1, 1, dtype=torch.bool))
    sums.merge(other)
    assert sums.measures()[2, 0].item() == pytest.approx(sum(words + [7.0]) / 5, rel=1e-12)
    assert sums.rows_max_weight.tolist() == [2.0]
