"""Sink and previous-token heads, marked by inspect: planted in one layer's q and k, each read by its rule, and a
head that spreads its weight marked as neither."""

import math

import pytest
import torch

from attnscale.headcheck.engine import HeadCheck, InspectConfig, Layer
from attnscale.core.head_kinds import SHARE, HeadKinds
from attnscale.headcheck.show import format_table

T, D = 8, 8


def _planted() -> tuple[torch.Tensor, torch.Tensor]:
    """Head 0 a sink (every query meets key 0 alone), head 1 a previous-token head (query i meets key i - 1),
    head 2 uniform (every score 0)."""
    q, k = torch.zeros(1, 3, T, D), torch.zeros(1, 3, T, D)
    q[0, 0, :, 0], k[0, 0, 0, 0] = 10.0, 10.0
    for i in range(T):
        q[0, 1, i, (i - 1) % D] = 30.0
        k[0, 1, i, i] = 1.0
    return q, k


def test_inspect_marks_a_planted_sink_head_and_a_previous_token_head():
    check = HeadCheck(InspectConfig(model="planted", what_ifs=()))
    q, k = _planted()
    causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    check.add(0, Layer(1 / math.sqrt(D), None, 3, 3, D, True, "1/sqrt(d)"), q, k, causal)
    result = check.result("planted", "Planted", [list(range(T))], 1)
    assert [(h["layer"], h["head"], h["kind"]) for h in result.head_kinds] == [(0, 0, "sink"), (0, 1, "previous")]
    assert all(h["share"] > 0.95 for h in result.head_kinds)
    table = format_table(result)
    assert "sink heads (at least half of a row's weight on the first key it sees): 1 of 3" in table
    assert "previous-token heads (at least half on the key before the row's own): 1 of 3\n  layer 0, head 1:" in table


def test_the_rule_reads_the_rows_that_see_two_keys_and_the_first_key_each_row_sees():
    kinds = HeadKinds()
    # left padding: key 0 hidden, so key 1 is the first each row sees; row 0 sees nothing and row 1 one key
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    visible[:, 0] = False
    pattern = torch.zeros(1, 1, T, T)
    pattern[0, 0, 1:, 1] = 1.0  # every row's weight on key 1
    kinds.add(0, pattern, visible.view(1, 1, T, T))
    first, prev = kinds.shares(0)
    assert first == [1.0] and prev == [pytest.approx(1 / 6)]  # rows 2..7 count; row 2's previous key is key 1
    assert kinds.kinds(0) == ["sink"] and SHARE == 0.5
