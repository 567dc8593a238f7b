"""capture.reduce: the one per-head reduction, streamed a block of query rows at a time.

Every number is checked against the materialised reference (``tests/reference.py``: whole B×H×T×S
tensors, head by head in float64, from the definitions) at 1e-6 relative, whatever the block size."""

import math

import pytest
import torch

from attnscale.capture.call import HIDDEN_AT, AttentionCall
from attnscale.capture.reduce import BYTES_PER_ENTRY, _plan, dense, reduce_call, reduce_scores
from attnscale.capture import smax
from attnscale.capture.smax import head_max
from attnscale.capture.sums import HeadSums
from attnscale.core import diagnostics as D
from attnscale.core.attention import build_mask, masked_softmax
from modded_reference import pooled_measures, scores_of
from reference import call_measures, head_measures

# the default budget (one block), a budget of a few rows, and one of a single row of a single head
BUDGETS = (256 << 20, 3 * 4 * 40 * BYTES_PER_ENTRY, 1)


def _close(got, want, rel=1e-6):
    got, want = got.double(), want.double()
    assert torch.isnan(got).tolist() == torch.isnan(want).tolist()
    ok = ~torch.isnan(want)
    err = ((got - want).abs() / want.abs().clamp_min(1e-12))[ok]
    assert float(err.max()) < rel, (got, want)


def _qk(seed, B=2, H=4, K=4, T=23, S=None, D_=16, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    return sharp * torch.randn(B, H, T, D_, generator=g), torch.randn(B, K, S, D_, generator=g)


CAUSAL = torch.ones(23, 23, dtype=torch.bool).tril()[None, None]
PAD_BT = torch.ones(2, 23, dtype=torch.bool)
PAD_BT[1, 17:] = False
PADDED = CAUSAL & PAD_BT[:, None, None, :] & PAD_BT[:, None, :, None]
ALIBI = -(torch.arange(23)[:, None] - torch.arange(23)[None, :]).abs().float()[None, None] * torch.tensor(
    [0.5, 0.25, 0.125, 0.0625])[None, :, None, None]

CASES = {
    "random": dict(),
    "sharpened": dict(sharp=12.0),  # many frozen rows
    "causal": dict(visible=CAUSAL),
    "padded": dict(visible=PADDED),
    "gqa": dict(K=2, visible=CAUSAL),
    "softcapped": dict(sharp=6.0, cap=lambda s: 3.0 * torch.tanh(s / 3.0), visible=CAUSAL),
    "bias": dict(visible=CAUSAL, bias=ALIBI),
    "bias per sequence": dict(visible=CAUSAL, bias=ALIBI * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1)),
}


@pytest.mark.parametrize("memory", BUDGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_streaming_equals_the_materialised_reference(case, memory):
    kw = dict(CASES[case])
    q, k = _qk(len(case), K=kw.pop("K", 4), sharp=kw.pop("sharp", 1.0))
    visible, bias, cap = kw.get("visible"), kw.get("bias"), kw.get("cap")
    call = AttentionCall(q, k, mask=visible, cap=cap, bias=bias)
    got = reduce_call(call, memory=memory).measures()
    _close(got, call_measures(q, k, 16 ** -0.5, visible, bias, cap))
    if case == "sharpened":
        assert 0.1 < float(got[3].mean()) < 0.9  # frozen rows, neither none nor all


@pytest.mark.parametrize("memory", BUDGETS)
def test_rows_that_see_no_key_come_first_and_every_row_after_them_still_counts(memory):
    """Causal, bottom right, with fewer keys than queries: query i sees keys j <= i - 4, so rows 0-3 see none."""
    q, k = _qk(27, T=9, S=5)
    visible = (torch.arange(9)[:, None] - 4 >= torch.arange(5)[None, :])[None, None]
    call = AttentionCall(q, k, is_causal=True, diagonal=-4)
    assert torch.equal(call.visible().expand(1, 1, 9, 5), visible[0, 0].expand(1, 1, 9, 5))
    _close(reduce_call(call, memory=memory).measures(), call_measures(q, k, 16 ** -0.5, visible))


def test_query_heads_that_cannot_share_the_key_heads_are_one_line():
    from attnscale.errors import ConfigError

    q, k = _qk(28, H=4, K=3)
    with pytest.raises(ConfigError, match=r"^4 query heads cannot share 3 key heads evenly; give q as B×H×T×D"):
        reduce_call(AttentionCall(q, k))


def test_the_plan_splits_sequences_then_rows_then_whole_groups_of_heads():
    entry = BYTES_PER_ENTRY
    assert _plan(4, 8, 2, 10, 10, 4 * 8 * 10 * 10 * entry) == (4, 8, 10)  # everything at once
    assert _plan(4, 8, 2, 10, 10, 8 * 10 * 10 * entry) == (1, 8, 10)  # a sequence at a time
    assert _plan(4, 8, 2, 10, 10, 8 * 10 * 3 * entry) == (1, 8, 3)  # three rows of every head
    assert _plan(4, 8, 2, 10, 10, 5 * 10 * entry) == (1, 4, 1)  # one row of two whole GQA groups
    assert _plan(4, 8, 2, 10, 10, 1) == (1, 2, 1)  # never less than one group's row


@pytest.mark.parametrize("fill", [-math.inf, -1e4, -1e9, torch.finfo(torch.float32).min])
def test_every_fill_in_use_hides_the_key_as_minus_inf_does(fill):
    q, k = _qk(7)
    want = reduce_call(AttentionCall(q, k, mask=CAUSAL)).measures()
    got = reduce_call(AttentionCall(q, k, mask=torch.zeros(1, 1, 23, 23).masked_fill(~CAUSAL, fill))).measures()
    _close(got, want)
    assert float(got[1].max()) < 20  # the fill is no score


def test_the_hidden_line_is_minus_ten_thousand():
    assert HIDDEN_AT == -1e4
    q, k = _qk(8, T=3)
    mask = torch.tensor([[0.0, -1e4, -9999.0]] * 3)[None, None]
    visible = AttentionCall(q, k, mask=mask).visible()
    assert visible[0, 0, 0].tolist() == [True, False, True]  # -9,999 is a (large) bias, -10,000 a fill


def test_a_bias_enters_the_weights_never_the_scores():
    q, k = _qk(9)
    plain = reduce_call(AttentionCall(q, k, mask=CAUSAL)).measures()
    sums = reduce_call(AttentionCall(q, k, mask=torch.where(CAUSAL, ALIBI, -1e9)))
    got = sums.measures()
    _close(got[:2], plain[:2])  # spread and max_score: q·kᵀ × scale alone
    assert float((got[2] - plain[2]).abs().min()) > 0.1  # the weights moved: fewer effective words
    lo, hi = sums.bias_range()
    # the bias range over the visible keys, by head: the farthest key of the last row, and the diagonal's 0
    assert lo.tolist() == pytest.approx([-22 * s for s in (0.5, 0.25, 0.125, 0.0625)]) and hi.tolist() == [0.0] * 4


def test_no_bias_no_range():
    q, k = _qk(10)
    assert torch.isnan(reduce_call(AttentionCall(q, k, mask=CAUSAL)).bias_range()).all()


def test_padding_is_neither_a_row_nor_a_key():
    q, k = _qk(11)
    got = reduce_call(AttentionCall(q, k, is_causal=True), padding_BT=PAD_BT).measures()
    _close(got, call_measures(q, k, 16 ** -0.5, PADDED))
    # with an additive mask the padding becomes a fill too
    additive = torch.zeros(1, 1, 23, 23).masked_fill(~CAUSAL, -1e9)
    _close(reduce_call(AttentionCall(q, k, mask=additive), padding_BT=PAD_BT).measures(), got)


def test_padding_of_a_call_of_another_length_hides_what_it_can_and_keeps_the_calls_own_mask():
    """A cross-attention's padding hides keys where its length is the keys', rows where it is the queries'; a
    padding of another batch or length leaves the call as it is; a mask_mod of the call's own still holds."""
    q, k = _qk(13, T=5, S=9)
    keys_BS = torch.ones(2, 9, dtype=torch.bool)
    keys_BS[1, 6:] = False
    _close(reduce_call(AttentionCall(q, k), padding_BT=keys_BS).measures(),
           call_measures(q, k, 16 ** -0.5, keys_BS[:, None, None, :]))
    rows_BT = torch.ones(2, 5, dtype=torch.bool)
    rows_BT[0, 3:] = False
    _close(reduce_call(AttentionCall(q, k), padding_BT=rows_BT).measures(),
           call_measures(q, k, 16 ** -0.5, rows_BT[:, None, :, None].expand(2, 1, 5, 9)))
    whole = reduce_call(AttentionCall(q, k)).measures()
    for other in (torch.zeros(3, 9, dtype=torch.bool), torch.zeros(2, 7, dtype=torch.bool)):
        _close(reduce_call(AttentionCall(q, k), padding_BT=other).measures(), whole)
    b, h, i, j = (torch.arange(n).view(*([1] * d), n, *([1] * (3 - d))) for d, n in enumerate((2, 4, 5, 9)))
    own = (i + 4 >= j) & (j != b + h)  # causal, bottom right, and one key hidden by batch and head
    call = AttentionCall(q, k, mask_mod=lambda b, h, qi, ki: (qi + 4 >= ki) & (ki != b + h))
    _close(reduce_call(call, padding_BT=keys_BS).measures(), call_measures(q, k, 16 ** -0.5, own & keys_BS[:, None, None, :]))


def test_causal_bottom_right_and_a_window_are_read_a_block_at_a_time():
    q, k = _qk(12, T=5, S=9)
    i, j = torch.arange(5)[:, None] + 4, torch.arange(9)[None, :]
    want = ((j <= i) & (i - j < 3))[None, None]
    call = AttentionCall(q, k, is_causal=True, diagonal=4, window=3)
    assert torch.equal(call.visible().expand(1, 1, 5, 9), want)
    for memory in BUDGETS:
        _close(reduce_call(call, memory=memory).measures(), call_measures(q, k, 16 ** -0.5, want))


def test_a_mask_mod_is_read_as_flex_attention_reads_it():
    q, k = _qk(13)
    call = AttentionCall(q, k, mask_mod=lambda b, h, qi, ki: (qi >= ki) & (qi - ki < 4))
    want = (torch.ones(23, 23).tril().bool() & ~torch.ones(23, 23).tril(-4).bool())[None, None]
    _close(reduce_call(call, memory=1).measures(), call_measures(q, k, 16 ** -0.5, want))


def test_a_what_if_factor_replaces_the_calls_own():
    q, k = _qk(14)
    call = AttentionCall(q, k, mask=CAUSAL)
    _close(reduce_call(call, factor=1.0).measures(), call_measures(q, k, 1.0, CAUSAL))


def test_blocks_added_in_any_order_and_split_give_the_whole():
    """Chan's merge: sums over two halves of the batch merged equal the sums over all of it, at a large mean."""
    q, k = _qk(15)
    q = q + 30.0  # scores with a mean far from 0
    whole = reduce_call(AttentionCall(q, k, mask=CAUSAL)).measures()
    a = reduce_call(AttentionCall(q[:1], k[:1], mask=CAUSAL))
    a.merge(reduce_call(AttentionCall(q[1:], k[1:], mask=CAUSAL)))
    _close(a.measures(), whole)
    _close(whole, call_measures(q, k, 16 ** -0.5, CAUSAL))
    # the squares behind the standard errors are summed too
    _close(a.standard_errors(), reduce_call(AttentionCall(q, k, mask=CAUSAL)).standard_errors())


def test_standard_errors_are_each_row_measures_sample_sd_over_root_rows():
    """By hand from the rows' own weights: effective words exp(H), frozen (max weight > 0.99), push
    sqrt(Σp² − 2Σp³ + (Σp²)²), max weight; SD with n − 1 over sqrt(n), n the rows that see two keys or more."""
    q, k = _qk(29, B=1, T=40, sharp=2.5)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()[None, None]
    sums = reduce_call(AttentionCall(q, k, mask=causal), sample_rows=12, seed=5)
    rows = torch.randperm(40, generator=torch.Generator().manual_seed(5))[:12].sort().values
    rows = rows[rows > 0]  # row 0 sees one key
    s = scores_of(q[:, :, rows], k, 16 ** -0.5).masked_fill(~causal[:, :, rows], -math.inf)
    p = torch.softmax(s, -1)[0]  # H × n × 40
    s2, s3, top = p.pow(2).sum(-1), p.pow(3).sum(-1), p.max(-1).values
    per_row = [torch.special.entr(p).sum(-1).exp(), (top > 0.99).double(), (s2 - 2 * s3 + s2**2).sqrt(), top]
    want = torch.stack([x.std(-1, unbiased=True) / math.sqrt(len(rows)) for x in per_row])
    assert sums.rows.tolist() == [float(len(rows))] * 4
    torch.testing.assert_close(sums.standard_errors(), want, rtol=1e-5, atol=1e-12)
    # two counted rows (rows 1 and 2 of a causal call of 3): n - 1 = 1; one counted row: no standard error
    q3, k3 = _qk(30, B=1, T=3)
    p3 = torch.softmax(scores_of(q3, k3, 16 ** -0.5).masked_fill(~CAUSAL[..., :3, :3], -math.inf), -1)[0, :, 1:]
    words = torch.special.entr(p3).sum(-1).exp()
    se = reduce_call(AttentionCall(q3, k3, is_causal=True)).standard_errors()
    torch.testing.assert_close(se[0], words.std(-1, unbiased=True) / math.sqrt(2), rtol=1e-5, atol=1e-12)
    assert torch.isnan(reduce_call(AttentionCall(q3[:, :, :2], k3[:, :, :2], is_causal=True)).standard_errors()).all()


def test_the_models_own_scores_give_the_reference():
    """reduce_scores, training's path: scores with hidden keys -inf, their softmax the weights."""
    g = torch.Generator().manual_seed(16)
    for causal, std in ((True, 3.0), (False, 3.0), (True, 40.0)):
        pad_BT = torch.ones(3, 9, dtype=torch.bool)
        pad_BT[-1, 6:] = False
        mask = build_mask(9, causal, pad_BT) & pad_BT[:, None, :, None]
        scores = (std * torch.randn(3, 4, 9, 9, generator=g)).masked_fill(~mask, -math.inf)
        want = head_measures(scores, torch.softmax(scores.double(), -1).nan_to_num(0.0))  # weights in float64
        for memory in BUDGETS:
            _close(reduce_scores(scores, memory=memory).measures(), want)


@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_the_threshold_is_the_sums_own(threshold):
    scores = 10 * torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(17))
    want = head_measures(scores, torch.softmax(scores, -1), threshold)
    _close(reduce_scores(scores, threshold=threshold).measures(), want)


def test_a_row_exactly_at_the_threshold_is_not_frozen():
    # weights (0.5, 0.5) at threshold 0.5: not above it
    scores = torch.zeros(1, 1, 2, 2)
    assert reduce_scores(scores, threshold=0.5).measures()[3].tolist() == [0.0]


def test_one_hot_rows_by_hand_and_empty_sums():
    assert torch.isnan(HeadSums(1).measures()).all()  # nothing added: NaN, not 0
    scores = torch.tensor([[[[0.0, -100.0], [-100.0, 0.0]]]])
    m = dict(zip(D.HEAD_MEASURES, reduce_scores(scores).measures()[:, 0].tolist()))
    assert m["frozen_fraction"] == 1.0 and m["effective_words"] == pytest.approx(1.0) and m["push"] == pytest.approx(0.0, abs=1e-20)
    assert m["spread"] == pytest.approx(50.0) and m["max_score"] == 100.0 and m["max_weight"] == pytest.approx(1.0)


def test_one_counted_row_by_hand():
    # T = 2, causal: row 0 sees one key (not counted); row 1's weights are (1/4, 3/4)
    scores = torch.tensor([[[[0.5, -math.inf], [math.log(0.25), math.log(0.75)]]]])  # float32, as a model's
    m = dict(zip(D.HEAD_MEASURES, reduce_scores(scores).measures()[:, 0].tolist()))
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert m["effective_words"] == pytest.approx(math.exp(entropy), rel=1e-7)
    assert m["max_weight"] == pytest.approx(0.75, rel=1e-7) and m["frozen_fraction"] == 0.0
    s2, s3 = 0.25**2 + 0.75**2, 0.25**3 + 0.75**3
    assert m["push"] == pytest.approx(math.sqrt(s2 - 2 * s3 + s2**2), rel=1e-7)
    values = [0.5, math.log(0.25), math.log(0.75)]  # the three visible scores
    mean = sum(values) / 3
    assert m["spread"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 3), rel=1e-7)
    assert m["max_score"] == pytest.approx(-math.log(0.25), rel=1e-7)


def test_sampled_rows_carry_their_standard_errors():
    q, k = _qk(18, B=1, T=200, sharp=3.0)
    causal = torch.ones(200, 200, dtype=torch.bool).tril()[None, None]
    full = reduce_call(AttentionCall(q, k, mask=causal)).measures()
    sums = reduce_call(AttentionCall(q, k, mask=causal), sample_rows=60, seed=3)
    picked = torch.randperm(200, generator=torch.Generator().manual_seed(3))[:60]
    assert sums.rows.tolist() == [60.0 - bool((picked == 0).any())] * 4  # row 0 sees one key: never counted
    se = sums.standard_errors()
    got = sums.measures()[2:]
    assert bool((se[0] > 0).all()) and bool((se >= 0).all())  # no frozen row sampled: that SE is 0
    # each row measure within 4 standard errors of the full mean (a sample of 60 rows of 200); the frozen
    # share, a rare event here, within 0.05 (a sample without a frozen row has a standard error of 0)
    words, push, weight = (2, 0), (4, 2), (5, 3)
    for m, r in (words, push, weight):
        assert bool(((got[r] - full[m]).abs() <= 4 * se[r]).all()), D.HEAD_MEASURES[m]
    assert bool(((got[1] - full[3]).abs() <= 0.05).all())


def test_sampled_rows_are_the_rows_the_seed_draws():
    """sample_rows takes the rows a CPU generator seeded with ``seed`` permutes first, sorted: the measures are
    those of exactly those rows, by the reference (seed 0 where none is given); another seed, other rows."""
    q, k = _qk(23, B=1, T=40)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    window = ((j <= i) & (i - j < 6))[None, None]  # causal and a window: each row's keys are its own range
    call = AttentionCall(q, k, is_causal=True, window=6)
    for seed in (None, 3, 4):
        rows = torch.randperm(40, generator=torch.Generator().manual_seed(seed or 0))[:7].sort().values
        for memory in BUDGETS:  # blocks of several sampled rows, and of one
            given = {} if seed is None else {"seed": seed}
            got = reduce_call(call, sample_rows=7, memory=memory, **given).measures()
            _close(got, call_measures(q[:, :, rows], k, 16 ** -0.5, window[:, :, rows]), rel=1e-5)
    assert not torch.equal(reduce_call(call, sample_rows=7, seed=3).measures(),
                           reduce_call(call, sample_rows=7, seed=4).measures())


def test_a_sink_is_in_every_rows_denominator_and_nowhere_else():
    q, k = _qk(24, K=2)
    sink = torch.tensor([-2.0, -1.0, -3.0, -0.5])
    s = scores_of(q, k, 0.25)
    everything = torch.ones_like(s, dtype=torch.bool)
    e = s.exp()
    p = e / (e.sum(-1, keepdim=True) + sink.double().exp().view(1, 4, 1, 1))  # the rows sum to 1 - p_sink
    want = pooled_measures([(s, p, everything)])
    for memory in BUDGETS:
        _close(reduce_call(AttentionCall(q, k, scale=0.25, sink=sink), memory=memory).measures(), want, rel=1e-5)


def test_a_score_mod_s_additions_are_the_bias_and_its_logits_the_weights_without_a_mask():
    q, k = _qk(25)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])

    def alibi(score, b, h, i, j):
        return score - (i - j).abs().float() * slopes[h]

    sums = reduce_call(AttentionCall(q, k, score_mod=alibi))
    bias = -(torch.arange(23)[:, None] - torch.arange(23)[None, :]).abs().float()[None, None] * slopes.view(1, 4, 1, 1)
    _close(sums.measures(), call_measures(q, k, 16 ** -0.5, None, bias=bias), rel=1e-5)
    lo, hi = sums.bias_range()
    assert lo.tolist() == pytest.approx([-22 * float(x) for x in slopes], rel=1e-6) and hi.tolist() == [0.0] * 4


@pytest.mark.parametrize("memory", BUDGETS)
def test_a_score_mod_by_sequence_and_head_beside_a_mask_and_a_bias(memory):
    """What the score_mod adds (here by sequence and head), plus the call's bias, is the bias; the mask still
    hides; each head's bias range is its own."""
    q, k = _qk(31)

    def mod(score, b, h, i, j):
        return score + (b.float() + 1.0) * 0.1 * (h.float() - j.float() / 23)

    offset = torch.tensor([0.0, 1.0, -2.0, 0.5]).view(1, 4, 1, 1)
    sums = reduce_call(AttentionCall(q, k, mask=PADDED, bias=ALIBI + offset, score_mod=mod), memory=memory)
    b, h, _, j = (torch.arange(n).view(*([1] * d), n, *([1] * (3 - d))) for d, n in enumerate((2, 4, 23, 23)))
    added = (b + 1.0) * 0.1 * (h - j / 23) + ALIBI + offset
    _close(sums.measures(), call_measures(q, k, 16 ** -0.5, PADDED, bias=added), rel=1e-5)
    lo, hi = sums.bias_range()
    per_head = [added.expand(2, 4, 23, 23)[:, x][PADDED.expand(2, 4, 23, 23)[:, x]] for x in range(4)]
    assert lo.tolist() == pytest.approx([float(v.min()) for v in per_head], rel=1e-5)
    assert hi.tolist() == pytest.approx([float(v.max()) for v in per_head], rel=1e-5)
    assert len(set(round(x, 4) for x in hi.tolist())) == 4  # each head's range its own


@pytest.fixture(params=["float32", "screened"])
def route(request, monkeypatch):
    """head_max by its float32 blocks, or screened in bfloat16 first (forced at every size, on any CPU)."""
    monkeypatch.setattr(smax, "SCREEN", request.param == "screened")
    monkeypatch.setattr(smax, "SCREEN_FROM", 0)
    return request.param


def test_head_max_without_a_mask_and_under_one_with_small_scores(route):
    q, k = _qk(26)
    raw = (q @ k.transpose(-2, -1)).abs() * 0.01
    torch.testing.assert_close(head_max(AttentionCall(q, k, scale=0.01)), raw.amax((0, 2, 3)))
    # every visible |score| below 1: a hidden key counts as nothing, not as 1
    assert float(raw.max()) < 1
    torch.testing.assert_close(head_max(AttentionCall(q, k, scale=0.01, mask=CAUSAL)),
                               raw.masked_fill(~CAUSAL, 0).amax((0, 2, 3)))


def test_head_max_is_the_score_max_over_visible_keys_without_the_bias(route):
    q, k = _qk(19, K=2)
    call = AttentionCall(q, k, mask=torch.where(CAUSAL, ALIBI, -1e9))
    want = call_measures(q, k, 16 ** -0.5, CAUSAL)[1]
    for memory in BUDGETS:
        torch.testing.assert_close(head_max(call, memory), want, rtol=1e-6, atol=0)


def test_dense_gives_the_logits_and_weights():
    q, k = _qk(20)
    logits, weights = dense(AttentionCall(q, k, mask=torch.where(CAUSAL, ALIBI, -1e4)))
    raw = (q @ k.transpose(-2, -1)) / 4 + ALIBI
    torch.testing.assert_close(logits, raw.masked_fill(~CAUSAL, -math.inf))
    torch.testing.assert_close(weights, torch.softmax(logits, -1))


def test_dense_under_a_sink_a_score_mod_a_softcap_and_gqa_is_the_definitions():
    """Each branch of dense written out here: keys shared by 2 query heads each, the score c·tanh(s/c) after
    the scale, a score_mod adding (kv_idx - q_idx)·0.1 on head 1 only, and a sink in every row's denominator."""
    q, k = _qk(21, K=2, sharp=3.0)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0])

    def mod(score, b, h, i, j):
        return score + torch.where(h == 1, (j - i).float() * 0.1, 0.0)

    logits, weights = dense(AttentionCall(q, k, scale=0.3, softcap=2.0, is_causal=True, score_mod=mod, sink=sink))
    k_rep = k.repeat_interleave(2, dim=1)
    raw = 2.0 * torch.tanh((q @ k_rep.transpose(-2, -1)) * 0.3 / 2.0)
    i, j = torch.arange(23)[:, None], torch.arange(23)[None, :]
    raw[:, 1] += (j - i).float() * 0.1
    want = raw.masked_fill(~CAUSAL, -math.inf)
    torch.testing.assert_close(logits, want)
    e = want.exp()
    torch.testing.assert_close(weights, e / (e.sum(-1, keepdim=True) + sink.exp().view(1, 4, 1, 1)))
    # the rows sum to 1 less the sink's share
    share = 1 / (1 + sink.exp().view(1, 4, 1) / e.sum(-1))
    torch.testing.assert_close(weights.sum(-1), share)


def test_dense_reads_a_what_if_factor_a_bias_beside_a_score_mod_and_rows_that_see_no_key():
    q, k = _qk(22)
    logits, weights = dense(AttentionCall(q, k, scale=0.1), factor=0.5)  # no mask: every key seen
    raw = (q @ k.transpose(-2, -1)) * 0.5  # the what-if's factor, not the call's
    torch.testing.assert_close(logits, raw)
    torch.testing.assert_close(weights, torch.softmax(raw, -1))

    def mod(score, b, h, i, j):
        return score * 2

    logits, weights = dense(AttentionCall(q, k, scale=0.25, mask=PADDED, bias=ALIBI, score_mod=mod))
    want = ((q @ k.transpose(-2, -1)) * 0.25 * 2 + ALIBI).masked_fill(~PADDED, -math.inf)  # the mod's output, then the bias
    torch.testing.assert_close(logits, want)
    e = want.exp()
    total = e.sum(-1, keepdim=True)
    # sequence 1's padded query rows see no key: weight 0 there, not NaN
    assert bool((total[1, :, 17:] == 0).all())
    torch.testing.assert_close(weights, torch.where(total > 0, e / total.clamp_min(1e-30), 0.0))


def test_sums_live_on_the_device_they_are_given_and_mps_sums_on_the_cpu():
    assert HeadSums(2, device="meta").data.device.type == "meta"  # "meta" stands in for a GPU
    with torch.device("meta"):  # a Mac user's set_default_device("mps") moves the default; the sums go by name
        sums = HeadSums(4, device="mps")
    assert (sums.data.device.type, sums.data.dtype) == ("cpu", torch.float64)


def test_per_head_numbers_and_single_key_rows_left_out():
    mask = build_mask(5, causal=True)
    scores = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(2))
    scores[:, 1] *= 100  # head 1 frozen
    scores = scores.masked_fill(~mask, -math.inf)
    m = reduce_scores(scores).measures()
    assert m.shape == (len(D.HEAD_MEASURES), 3)
    assert float(m[3, 1]) > 0.7 and float(m[3, 0]) < 0.5
    assert float(m[0, 1]) == pytest.approx(D.spread(scores[:, 1]).item(), rel=1e-6)
    # row 0 sees one key: left out, so a soft head is not called partly frozen
    soft = torch.zeros(1, 1, 5, 5).masked_fill(~mask, -math.inf)
    assert reduce_scores(soft).measures()[3].tolist() == [0.0]


def test_a_head_that_sees_one_score_has_spread_zero_and_no_largest_score():
    """One row that sees one key (a one-token call): the population spread of a single score is 0; the row is
    left out of max |score| and the row measures (its weight is 1 whatever its score, ``capture.rows``), so they
    are NaN: no row is counted. Only a head that saw nothing has a NaN spread."""
    q = torch.tensor([[3.0, -1.0, 2.0, 0.5], [1.0, 1.0, 1.0, 1.0]]).view(1, 2, 1, 4)  # two heads, one row
    k = torch.tensor([[-2.0, 4.0, 1.0, 2.0], [0.5, 0.5, 0.5, 0.5]]).view(1, 2, 1, 4)  # and one key
    m = reduce_call(AttentionCall(q, k, is_causal=True)).measures()
    assert m[0].tolist() == [0.0, 0.0]
    assert all(math.isnan(x) for x in m[1:].flatten().tolist())
    with pytest.raises(AttributeError, match="^not_a_field$"):
        HeadSums(2).not_a_field


def _s_max_by_hand(q, k, factor, visible, cap=None):
    """Each head's largest |cap(q·kᵀ × factor)| over the visible keys of the rows that see two keys or more,
    every score in float64 (0 where none)."""
    k = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.double() @ k.transpose(-2, -1)) * factor
    s = cap(s) if cap is not None else s
    visible = visible.expand_as(s)
    visible = visible & (visible.sum(-1, keepdim=True) >= 2)
    return s.abs().masked_fill(~visible, 0).amax((0, 2, 3))


WINDOW = CAUSAL & (torch.arange(23)[:, None] - torch.arange(23)[None, :] < 5)


@pytest.mark.parametrize("memory", BUDGETS)
def test_head_max_of_causal_windowed_padded_gqa_and_capped_calls_is_the_float64_max(memory, route):
    """The calls whose mask is their structure and a key padding mask (each block one product, the structure cut
    off in place, the factor and cap put on the H maxima): every case against each score in float64."""
    qc, kc = _qk(31, K=2, sharp=4.0)
    q, k = qc.clone(), kc.clone()
    q[1, :, 20] = math.nan  # a padded query row's NaN, and a padded key's inf, are no score
    k[1, :, 19] = math.inf
    cases = [
        (AttentionCall(q[:1], k[:1], is_causal=True), None, 0.25, CAUSAL, None),
        (AttentionCall(q, k, is_causal=True, window=5), PAD_BT, 0.25, WINDOW & PADDED, None),
        (AttentionCall(q, k, scale=-0.3, window=5), PAD_BT, 0.3, (torch.arange(23)[:, None] - torch.arange(23) < 5)
         & PAD_BT[:, None, None, :] & PAD_BT[:, None, :, None], None),
        (AttentionCall(qc, kc, is_causal=True, window=1), None, 0.25, torch.eye(23, dtype=torch.bool), None),
        (AttentionCall(q, k, is_causal=True, softcap=2.0), PAD_BT, 0.25, PADDED, lambda s: 2.0 * torch.tanh(s / 2.0)),
        (AttentionCall(qc, kc, mask=PAD_BT[:, None, None, :], is_causal=True), None, 0.25,
         CAUSAL & PAD_BT[:, None, None, :], None),
        (AttentionCall(q, k, mask=torch.where(PAD_BT, 0.0, -1e9)[:, None, None, :], is_causal=True), PAD_BT, 0.25,
         PADDED, None),
        (AttentionCall(q, k, scale=torch.tensor([0.1, 0.2, 0.3, 0.4]).view(1, 4, 1, 1), is_causal=True), PAD_BT,
         torch.tensor([0.1, 0.2, 0.3, 0.4]).view(1, 4, 1, 1).double(), PADDED, None),
    ]
    for call, pad, factor, visible, cap in cases:
        q_, k_ = call.q, call.k
        if pad is not None:  # the reference sees the padding as hidden: no NaN or inf of it reaches a score
            q_, k_ = q_.masked_fill(~pad[:, None, :, None], 0), k_.masked_fill(~pad[:, None, :, None], 0)
        want = _s_max_by_hand(q_, k_, factor, visible, cap)
        assert torch.isfinite(want).all()
        torch.testing.assert_close(head_max(call, memory, pad).double(), want, rtol=2e-6, atol=0)


def test_head_max_with_more_keys_than_queries_aligns_the_causal_diagonal_bottom_right(route):
    q, k = _qk(32, T=7, S=23)
    visible = torch.arange(23)[None, :] <= torch.arange(7)[:, None] + 16
    got = head_max(AttentionCall(q, k, is_causal=True, diagonal=16), 1)
    torch.testing.assert_close(got.double(), _s_max_by_hand(q, k, 0.25, visible), rtol=2e-6, atol=0)


def test_head_max_takes_the_general_blocks_for_a_mask_with_rows_and_gives_the_same_numbers(route):
    q, k = _qk(33, K=2)
    rows = PADDED & (torch.rand(2, 1, 23, 23, generator=torch.Generator().manual_seed(0)) < 0.7)
    torch.testing.assert_close(head_max(AttentionCall(q, k, mask=rows)).double(),
                               _s_max_by_hand(q, k, 0.25, rows), rtol=2e-6, atol=0)
