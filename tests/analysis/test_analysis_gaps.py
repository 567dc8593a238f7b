"""analysis.gaps: the gap table, paired seeds and where the gap starts, on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from attnscale.analysis import gaps as gap_tables
from attnscale.analysis.estimates import plus_minus


def _row(head_dim, scale, seed, ppl, status="done", lr=None):
    return {"head_dim": head_dim, "scale": scale, "seed": seed, "lr": lr, "valid_ppl": ppl, "status": status}


def test_gap_table_pairs_seeds_and_takes_the_se_of_the_differences():
    rows = [_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, 11.0),
            _row(64, "inv_sqrt_d", 1, 12.0), _row(64, "none", 1, 15.0),
            _row(64, "none", 2, 99.0)]  # seed 2 has no partner: left out
    table = gap_tables.gap_table(rows)
    (r,) = table["rows"]
    # differences 1 and 3: mean 2, sample std sqrt(2), SE 1
    assert r["seeds"] == 2 and r["gap"] == 2.0 and math.isclose(r["gap_se"], 1.0)
    assert r["baseline_ppl"] == 13.0 and r["reference_ppl"] == 11.0
    # 2 > 1 point, but its 95% interval with 1 degree of freedom is 2 ± 12.706: undecided, not a gap
    assert r["counts"] is None
    assert gap_tables.gap_by_head_dim(table) == {64: (2.0, r["gap_se"], 2)}


def test_a_gap_counts_when_its_t_interval_clears_zero():
    def table(diffs):
        rows = [x for s, g in enumerate(diffs) for x in (_row(64, "inv_sqrt_d", s, 10.0), _row(64, "none", s, 10.0 + g))]
        return gap_tables.gap_table(rows)["rows"][0]
    # differences 2, 3, 4: mean 3, SE 1/sqrt(3); lower end 3 − 4.3027/sqrt(3) = 0.516 > 0: a gap
    assert table([2.0, 3.0, 4.0])["counts"] is True
    # differences 0.5, 3, 5.5: mean 3, sd 2.5, SE 2.5/sqrt(3) = 1.443; lower end 3 − 4.3027·1.443 < 0: undecided
    assert table([0.5, 3.0, 5.5])["counts"] is None
    # the old "> 2 SE" rule would have counted the second (3 > 2 · 1.443); the t rule does not
    assert 3.0 > 2 * (2.5 / 3 ** 0.5)
    assert table([0.5, 0.9, 0.7])["counts"] is False  # under 1 point: never a gap


def test_an_undecided_head_dim_gives_the_start_both_ways():
    rows = []
    for d, diffs in ((64, [0.5, 3.0, 5.5]), (128, [2.0, 3.0, 4.0]), (256, [17.0, 17.5, 18.0])):
        for s, g in enumerate(diffs):
            rows += [_row(d, "inv_sqrt_d", s, 10.0), _row(d, "none", s, 10.0 + g)]
    table = gap_tables.gap_table(rows)
    assert [r["counts"] for r in table["rows"]] == [None, True, True]
    assert gap_tables.first_start(table) == 128 and gap_tables.first_start(table, undecided_counts=True) == 64


def test_gap_starts_where_every_wider_head_dim_has_a_gap():
    gaps = {32: 1.5, 64: 0.5, 128: 2.0, 256: 17.0}  # 32 has a gap, 64 breaks the run: start at 128
    rows = [x for d, g in gaps.items() for x in (_row(d, "inv_sqrt_d", 0, 40.0), _row(d, "none", 0, 40.0 + g))]
    table = gap_tables.gap_table(rows)
    assert [r["counts"] for r in table["rows"]] == [True, False, True, True]
    assert table["gap_starts_at"] == gap_tables.first_start(table) == 128
    assert table["rule"] == gap_tables.GAP_RULE


def test_diverged_baseline_counts_as_a_gap_and_unfinished_runs_are_left_out():
    rows = [_row(512, "inv_sqrt_d", 0, 40.0), _row(512, "none", 0, None, status="diverged"),
            _row(1024, "inv_sqrt_d", 0, 40.0), _row(1024, "none", 0, None, status="running")]
    table = gap_tables.gap_table(rows)
    (r,) = table["rows"]
    assert r["head_dim"] == 512 and r["diverged"] == "baseline" and r["gap"] is None and r["counts"]
    assert gap_tables.gap_by_head_dim(table) == {}  # no number to show


def test_learning_rates_get_their_own_start():
    rows = []
    for lr, gap in ((1e-3, 3.0), (1e-2, 0.2)):
        for d in (64, 256):
            rows += [_row(d, "inv_sqrt_d", 0, 40.0, lr=lr), _row(d, "none", 0, 40.0 + gap, lr=lr)]
    table = gap_tables.gap_table(rows)
    assert table["starts"] == [{"lr": 1e-3, "head_dim": 64, "head_dim_if_undecided": 64},
                               {"lr": 1e-2, "head_dim": None, "head_dim_if_undecided": None}]
    assert table["gap_starts_at"] is None  # two learning rates: no single answer
    assert gap_tables.gap_by_head_dim(table) == {64: (3.0, None, 1), 256: (3.0, None, 1)}  # the first lr's


def test_run_rows_keep_the_learning_rate_only_where_runs_vary_it():
    from types import SimpleNamespace as NS

    def run(lr, seed=0):
        return NS(run_id=f"d8-none-s{seed}", head_dim=8, scale="none", seed=seed, lr=lr, perplexity=5.0, status="done",
                  diverged_at=None, results=NS(train_seconds=1.5))

    (row,) = gap_tables.run_rows([run(3e-3)])
    assert row == {"run_id": "d8-none-s0", "head_dim": 8, "scale": "none", "seed": 0, "lr": None, "valid_ppl": 5.0,
                   "status": "done", "diverged_at": None, "train_seconds": 1.5}
    assert [r["lr"] for r in gap_tables.run_rows([run(3e-3), run(1e-2, 1)])] == [3e-3, 1e-2]
    assert [r["lr"] for r in gap_tables.run_rows([run(3e-3), run(3e-3, 1)])] == [None, None]
    assert [r["lr"] for r in gap_tables.run_rows([run(3e-3)], varied_lr=True)] == [3e-3]
    assert [r["lr"] for r in gap_tables.run_rows([run(3e-3), run(1e-2, 1)], varied_lr=False)] == [None, None]


def test_gap_table_orders_by_learning_rate_then_head_dim_and_skips_unpaired_head_dims():
    rows = []
    for lr in (1e-2, 1e-3):
        for d in (256, 64):
            rows += [_row(d, "inv_sqrt_d", 0, 10.0, lr=lr), _row(d, "none", 0, 12.0, lr=lr)]
    rows.insert(0, _row(32, "none", 0, 12.0, lr=1e-3))  # no reference at width 32: left out, the rest kept
    table = gap_tables.gap_table(rows)
    assert [(r["lr"], r["head_dim"]) for r in table["rows"]] == [(1e-3, 64), (1e-3, 256), (1e-2, 64), (1e-2, 256)]
    assert set(table) == {"baseline", "reference", "threshold_ppl", "rule", "rows", "starts", "gap_starts_at"}
    assert (table["baseline"], table["reference"]) == ("none", "inv_sqrt_d")
    assert set(table["rows"][0]) == {"lr", "head_dim", "seeds", "baseline_ppl", "reference_ppl", "gap", "gap_se",
                                     "diverged", "counts", "share"}
    assert gap_tables.share_by_head_dim(table) == {64: pytest.approx(0.2), 256: pytest.approx(0.2)}  # the first lr's
    rows += [_row(512, "inv_sqrt_d", 0, 10.0, lr=1e-2), _row(512, "none", 0, 20.0, lr=1e-2)]
    assert 512 not in gap_tables.share_by_head_dim(gap_tables.gap_table(rows))  # another lr's width is not the first's


def test_a_table_mixing_runs_without_and_with_a_learning_rate_lists_those_without_first():
    # None and a float do not compare: the order puts "no learning rate" first, then lrs ascending
    rows = [_row(d, scale, 0, ppl, lr=lr) for lr, d in ((3e-3, 32), (1e-3, 256), (None, 512), (None, 64))
            for scale, ppl in (("inv_sqrt_d", 10.0), ("none", 11.0))]
    table = gap_tables.gap_table(rows)
    assert [(r["lr"], r["head_dim"]) for r in table["rows"]] == [(None, 64), (None, 512), (1e-3, 256), (3e-3, 32)]
    assert [s["lr"] for s in table["starts"]] == [None, 1e-3, 3e-3]


def test_which_side_diverged_and_what_it_leaves():
    ref_only = [_row(64, "inv_sqrt_d", 0, None, status="diverged"), _row(64, "none", 0, 12.0)]
    (r,) = gap_tables.gap_table(ref_only)["rows"]
    assert (r["diverged"], r["gap"], r["gap_se"], r["share"]) == ("reference", None, None, None) and r["counts"] is False
    both = [_row(64, "inv_sqrt_d", 0, None, status="diverged"), _row(64, "none", 0, None, status="diverged")]
    (r,) = gap_tables.gap_table(both)["rows"]
    assert (r["diverged"], r["gap"]) == ("both", None) and r["counts"] is False
    # seed 0: the reference diverged; seed 1: both finished, 8 points apart. The width does not count
    mixed = ref_only + [_row(64, "inv_sqrt_d", 1, 10.0), _row(64, "none", 1, 18.0)]
    (r,) = gap_tables.gap_table(mixed)["rows"]
    assert r["diverged"] == "reference" and r["counts"] is False and r["gap"] is None and r["share"] is None
    # the baseline diverged on one seed of two: a gap that counts, with no number to show
    base = [_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, None, status="diverged"),
            _row(64, "inv_sqrt_d", 1, 10.0), _row(64, "none", 1, 11.0)]
    (r,) = gap_tables.gap_table(base)["rows"]
    assert r["diverged"] == "baseline" and r["counts"] is True and r["gap"] is None and r["share"] is None
    assert r["reference_ppl"] == 10.0 and r["baseline_ppl"] == 11.0


def test_no_rows_no_start():
    table = gap_tables.gap_table([])
    assert table["rows"] == [] and gap_tables.first_start(table) is None and table["gap_starts_at"] is None
    assert gap_tables.share_by_head_dim(table) == {} and gap_tables.gap_by_head_dim(table) == {}


def test_a_diverged_side_leaves_no_se_and_infinity_is_written_in_lower_case():
    # three seeds: the baseline diverged on seed 0; seeds 1 and 2 would give an SE, but the width has no number
    rows = [_row(64, "inv_sqrt_d", s, 10.0) for s in range(3)] + [_row(64, "none", 0, None, status="diverged"),
                                                                 _row(64, "none", 1, 11.0), _row(64, "none", 2, 13.0)]
    (r,) = gap_tables.gap_table(rows)["rows"]
    assert (r["diverged"], r["gap"], r["gap_se"]) == ("baseline", None, None)
    assert plus_minus(math.inf, None) == "inf"


def test_an_interval_that_only_touches_zero_leaves_the_gap_undecided(monkeypatch):
    # "wholly above 0": a lower end of exactly 0 does not clear it
    monkeypatch.setattr(gap_tables, "interval", lambda gap, se, n: (0.0, 2 * gap))
    rows = [x for s, g in enumerate([2.0, 4.0]) for x in (_row(64, "inv_sqrt_d", s, 10.0), _row(64, "none", s, 10.0 + g))]
    assert gap_tables.gap_table(rows)["rows"][0]["counts"] is None
    monkeypatch.setattr(gap_tables, "interval", lambda gap, se, n: (1e-9, 2 * gap))
    assert gap_tables.gap_table(rows)["rows"][0]["counts"] is True
