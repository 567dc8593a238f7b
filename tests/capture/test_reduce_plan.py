"""The reduction's plan (``capture.reduce._plan``): how many sequences, query heads and rows one block holds.

Each size is checked against its definition, found here by counting up (the most that fit, at least one,
and whole GQA groups of heads), and must be a Python int, not a float that equals one: a block size goes
to ``range()`` and to slicing. End to end, a call is measured at budgets where one row of every head is
over budget but a GQA group fits, against the materialised reference (``tests/reference.py``)."""

import itertools

import pytest
import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import BYTES_PER_ENTRY, _plan, reduce_call, reduce_scores
from reference import call_measures, head_measures


def _most(limit: int, cost_of, memory: int, least: int = 1, step: int = 1) -> int:
    """The largest n in least, least + step, … ≤ limit whose cost fits ``memory``; ``least`` where none does."""
    best = least
    for n in range(least, limit + 1, step):
        if cost_of(n) <= memory:
            best = n
    return best


def _plan_by_hand(B, H, G, T, S, memory):
    entry = BYTES_PER_ENTRY
    if H * S * T * entry <= memory:  # whole sequences
        return _most(B, lambda n: n * H * T * S * entry, memory), H, T
    if H * S * entry <= memory:  # rows of one sequence, every head
        return 1, H, _most(T, lambda r: r * H * S * entry, memory)
    # whole GQA groups of heads, as many as fit (at least one group), and then rows
    heads = _most(H, lambda h: h * S * entry, memory, least=G, step=G) if G * S * entry <= memory else G
    heads = min(H, heads)
    return 1, heads, _most(T, lambda r: r * heads * S * entry, memory)


SIZES = [(4, 8, 2, 10, 10), (3, 64, 8, 5, 7), (2, 12, 4, 9, 11), (1, 6, 1, 3, 13)]


@pytest.mark.parametrize("B, H, G, T, S", SIZES)
def test_every_block_size_is_the_largest_that_fits_and_an_int(B, H, G, T, S):
    entry = BYTES_PER_ENTRY
    budgets = {1, G * S * entry, G * S * entry + 1, 2 * G * S * entry - 1, H * S * entry - 1, H * S * entry,
               3 * H * S * entry, H * S * T * entry, 2 * H * S * T * entry + 5, B * H * S * T * entry, 10**12}
    for memory in sorted(budgets):
        got = _plan(B, H, G, T, S, memory)
        assert got == _plan_by_hand(B, H, G, T, S, memory), memory
        assert [type(v) for v in got] == [int, int, int], (memory, got)
        seqs, heads, rows = got
        assert heads % G == 0 or heads == H
        assert 1 <= seqs <= B and 1 <= heads <= H and 1 <= rows <= T


def test_the_issues_budget_one_row_of_every_head_over_it_a_group_within_it():
    """At the default 256 MiB, 64 heads at 128k keys: a row of every head is 320 MiB, a group of 8 fits."""
    memory, H, G, S = 256 << 20, 64, 8, 128 * 1024
    assert H * S * BYTES_PER_ENTRY > memory >= G * S * BYTES_PER_ENTRY
    got = _plan(1, H, G, 4, S, memory)
    assert got == (1, 48, 1) and [type(v) for v in got] == [int, int, int]
    assert got == _plan_by_hand(1, H, G, 4, S, memory)


def _qk(seed, B, H, K, T, D_=8):
    g = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(B, H, T, D_, generator=g), torch.randn(B, K, T, D_, generator=g)


@pytest.mark.parametrize("H, K", [(8, 2), (8, 4), (6, 3)])
def test_a_call_measured_by_whole_gqa_groups_is_the_whole_calls_numbers(H, K):
    B, T = 2, 9
    G = H // K
    q, k = _qk(H + K, B, H, K, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    want = call_measures(q, k, 8 ** -0.5, causal).double()
    row_of_all_heads = H * T * BYTES_PER_ENTRY
    for groups in range(1, K):  # one group's row fits, up to all groups but one: every head still measured once
        memory = groups * G * T * BYTES_PER_ENTRY + 7
        assert memory < row_of_all_heads
        seqs, heads, rows = _plan(B, H, G, T, T, memory)
        assert (seqs, heads, rows) == (1, groups * G, 1)
        got = reduce_call(AttentionCall(q, k, is_causal=True), memory=memory).measures()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)


def test_scores_measured_a_few_rows_at_a_time_are_the_whole_tensors_numbers():
    B, H, T = 2, 3, 7
    g = torch.Generator().manual_seed(5)
    scores = (4.0 * torch.randn(B, H, T, T, generator=g)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf)
    want = head_measures(scores, torch.softmax(scores, -1)).double()
    for memory in (1, 2 * H * T * BYTES_PER_ENTRY + 1, B * H * T * T * BYTES_PER_ENTRY):
        torch.testing.assert_close(reduce_scores(scores, memory=memory).measures(), want, rtol=1e-5, atol=1e-9)


def test_the_plan_never_asks_for_less_than_one_of_anything():
    for B, H, G, T, S in itertools.product((1, 3), (2, 4), (1, 2), (1, 5), (1, 6)):
        if H % G:
            continue
        for memory in (0, 1, 39, 40, 41):
            seqs, heads, rows = _plan(B, H, G, T, S, memory)
            assert seqs >= 1 and heads >= G and rows >= 1
