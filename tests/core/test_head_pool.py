"""diagnostics.HeadPool: head_summary's per-head numbers, pooled over batches.

The pool never holds more than one batch; what it reports must be what
head_summary reports on all the batches at once."""

import pytest
import torch

from attnscale.core import diagnostics as D
from attnscale.core.attention import build_mask, masked_softmax


def _batch(seed, B=3, H=4, T=9, *, causal=True, mean=0.0, std=3.0, pad=True, per_head=False):
    g = torch.Generator().manual_seed(seed)
    raw_BHTT = mean + std * torch.randn(B, H, T, T, generator=g)
    pad_BT = torch.ones(B, T, dtype=torch.bool)
    if pad:  # the last sequence is padded: its padding queries see no key, its real queries see fewer keys
        pad_BT[-1, T - 3 :] = False
    mask_B1TT = build_mask(T, causal, pad_BT) & pad_BT[:, None, :, None]
    if per_head:  # a head that sees only a window of 3 keys: rows differ from head to head
        window_HTT = torch.ones(H, T, T, dtype=torch.bool)
        window_HTT[0] = torch.ones(T, T, dtype=torch.bool).triu(-2).tril(2)
        mask_B1TT = mask_B1TT & window_HTT[None]
    scores_BHTT = raw_BHTT.masked_fill(~mask_B1TT, float("-inf"))
    return scores_BHTT, masked_softmax(scores_BHTT, mask_B1TT)


def _pooled(batches, threshold=D.FROZEN_THRESHOLD):
    pool = D.HeadPool(batches[0][0].shape[1], threshold)
    for scores_BHTT, pattern_BHTT in batches:
        pool.add(scores_BHTT, pattern_BHTT)
    return pool.result()


def _close(got, want):
    assert list(got) == list(want) == list(D.HEAD_MEASURES)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("kind", [
    {"causal": True}, {"causal": False}, {"causal": True, "per_head": True},
    {"causal": True, "std": 40.0},  # frozen rows: frozen_fraction is far from 0 and 1
    {"causal": False, "mean": 1e3, "std": 0.5},  # a large mean: E[x²] - mean² in float64 keeps its digits
])
def test_pooled_over_batches_equals_head_summary_on_the_concatenation(kind):
    batches = [_batch(seed, **kind) for seed in range(4)]
    want = D.head_summary(torch.cat([s for s, _ in batches]), torch.cat([p for _, p in batches]))
    _close(_pooled(batches), want)
    if kind.get("std") == 40.0:
        assert 0.2 < sum(want["frozen_fraction"]) / 4 < 0.95


def test_threshold_is_the_pools_own():
    batches = [_batch(seed, std=10.0) for seed in range(2)]
    for threshold in (0.5, 0.9):
        want = D.head_summary(torch.cat([s for s, _ in batches]), torch.cat([p for _, p in batches]), threshold)
        _close(_pooled(batches, threshold), want)


def test_gathered_rows_give_the_same_numbers_as_add():
    """The path inspect takes: scores with a shared boolean mask, then only the rows that count."""
    batches = [_batch(seed) for seed in range(3)]
    pool = D.HeadPool(4)
    for scores_BHTT, pattern_BHTT in batches:
        keep_B1TT = torch.isfinite(scores_BHTT[:, :1])
        pool.add_scores(scores_BHTT.nan_to_num(neginf=123.0), keep_B1TT)  # what is masked out never counts
        rows_BT = D.counted_rows(keep_B1TT[:, 0])
        pool.add_rows(pattern_BHTT.permute(0, 2, 1, 3)[rows_BT])
    _close(pool.result(), _pooled(batches))


def test_counted_rows_need_two_keys():
    keep_TT = torch.ones(4, 4, dtype=torch.bool).tril()
    assert D.counted_rows(keep_TT).tolist() == [False, True, True, True]
    assert D.MIN_KEYS == 2


def test_one_hot_rows_and_empty_pool():
    scores_BHTT = torch.tensor([[[[0.0, -100.0], [-100.0, 0.0]]]])
    pool = D.HeadPool(1)
    assert pool.result()["effective_words"] == [0.0]  # nothing added: zeros, not NaN
    pool.add(scores_BHTT, masked_softmax(scores_BHTT, None))
    r = pool.result()
    assert r["frozen_fraction"] == [1.0] and r["effective_words"] == pytest.approx([1.0])
    assert r["spread"] == pytest.approx([50.0]) and r["max_score"] == [100.0]


def test_frozen_head_share_is_half():
    assert D.FROZEN_HEAD_SHARE == 0.5


def test_measures_is_result_as_one_tensor_on_the_pools_device():
    pool = D.HeadPool(4)
    pool.add(*_batch(3))
    m = pool.measures()
    assert m.shape == (len(D.HEAD_MEASURES), 4) and m.dtype == torch.float64 and m.device == pool.rows.device
    assert dict(zip(D.HEAD_MEASURES, m.tolist())) == pool.result()


def test_an_mps_pool_keeps_its_float64_sums_on_the_cpu_whatever_the_default_device():
    # MPS has no float64: its scores are pooled on the CPU. Under another default device (here meta,
    # as a Mac user's set_default_device("mps") would be) the sums still go to the CPU, by name.
    with torch.device("meta"):
        assert torch.zeros(1).device.type == "meta"  # the default device has moved
        pool = D.HeadPool(4, device="mps")
    sums = [pool.entries, pool.rows, pool.sum, pool.sum_sq, pool.max_abs, *pool.row_sums.values()]
    assert {(t.device.type, t.dtype) for t in sums} == {("cpu", torch.float64)}
    cpu = D.HeadPool(4, device="cpu")
    for p in (pool, cpu):
        p.add(*_batch(5))
    assert pool.result() == cpu.result()
