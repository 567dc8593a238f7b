"""analysis.setups: the setup study's numbers, on hand-built rows."""

import math

import pytest

from attnscale.analysis import setups as sa


def row(axis, value, scale, seed, end_spread, end_frozen, ppl, start_spread=21.0, start_frozen=0.6, words=1.1,
        status="done", layers=None):
    settings = {"lr": 3e-3, "schedule": "cosine", "weight_decay": 0.1, "init": "torch", "norm": "post", "steps": 400}
    if axis != "base":
        settings[axis] = value
    return {"run": f"{axis}-{value}-{scale}-{seed}", "axis": axis, "value": None if axis == "base" else value,
            "scale": scale, "seed": seed, "head_dim": 1024, "status": status, "steps_done": settings["steps"],
            "perplexity": ppl, "settings": settings,
            "start_spread": start_spread if scale == "none" else 0.7, "end_spread": end_spread,
            "start_frozen_fraction": start_frozen, "end_frozen_fraction": end_frozen,
            "start_effective_words": 5.0, "end_effective_words": words,
            "end_spread_by_layer": layers if layers is not None else [end_spread / 2, end_spread * 1.5]}


ROWS = [
    # base: grows but short of 5,000; freezes more but not to 99%; scaled 5.2; gap 6 points
    row("base", None, "none", 0, 300.0, 0.93, 15.0), row("base", None, "none", 1, 340.0, 0.95, 15.4),
    row("base", None, "inv_sqrt_d", 0, 5.0, 0.2, 9.0), row("base", None, "inv_sqrt_d", 1, 5.4, 0.2, 9.2),
    # lr 9e-3: past 5,000 and 99%; scaled 3.0 (inside 3.4 ± 30%); gap 17 ± 0.5
    row("lr", 9e-3, "none", 0, 6000.0, 0.995, 26.5), row("lr", 9e-3, "none", 1, 7000.0, 0.991, 27.5),
    row("lr", 9e-3, "inv_sqrt_d", 0, 3.0, 0.1, 9.5), row("lr", 9e-3, "inv_sqrt_d", 1, 3.1, 0.1, 10.5),
    # pre-LN: the spread falls below its start, rows thaw; the scaled run is ahead by less than noise
    row("norm", "pre", "none", 0, 15.0, 0.3, 9.0), row("norm", "pre", "none", 1, 17.0, 0.4, 9.4),
    row("norm", "pre", "inv_sqrt_d", 0, 20.0, 0.1, 9.5), row("norm", "pre", "inv_sqrt_d", 1, 2.0, 0.1, 8.7),
]


def test_summary_is_a_mean_and_se_over_seeds_per_setup_and_scale():
    table = sa.summary_rows(ROWS)
    assert [(r["axis"], r["value"], r["scale"]) for r in table][:2] == [("base", "base", "none"), ("base", "base", "inv_sqrt_d")]
    assert [r["axis"] for r in table] == ["base"] * 2 + ["lr"] * 2 + ["norm"] * 2  # base first, then AXES order
    base = table[0]
    assert base["end_spread"] == pytest.approx(320.0) and base["end_spread_se"] == pytest.approx(20.0)
    assert base["end_spread_max_layer"] == pytest.approx(510.0) and base["seeds"] == base["done"] == 2
    g, se, n, ref = sa.gap(*sa.pair(table, ("lr", "9e-3")))
    assert (g, n, ref) == (pytest.approx(17.0), 2, pytest.approx(10.0)) and se == pytest.approx(0.0)
    g, se, n, ref = sa.gap(*sa.pair(table, ("base", "base")))
    assert g == pytest.approx(6.1) and se == pytest.approx(0.1)


def test_claims_say_where_the_direction_and_the_size_hold():
    # every figure below on the 95% t interval over 2 seeds (1 df: mean ± 12.706 SE), worked by hand
    judged = sa.claims(sa.summary_rows(ROWS))
    base, lr, pre = ("base", "base"), ("lr", "9e-3"), ("norm", "pre")
    every = [base, lr, pre]
    # end spread: base 320 ± 20 → 66 … 574, under 5,000; lr 6,500 ± 500 → 147 … 12,853, undecided;
    # rise (end − start by seed): base 299 ± 20 → 45 … 553 and lr above 0; pre −5 ± 1 → −17.7 … 7.7, undecided
    assert judged["end_spread"] == {"setups": every, "size": [], "size_undecided": [lr], "direction_setups": every,
                                    "direction": [base, lr], "direction_undecided": [pre]}
    # frozen: base 0.94 ± 0.01 → 0.813 … 1.067 and lr 0.993 ± 0.002 → 0.968 … 1.018 both reach 99%: undecided;
    # pre 0.35 ± 0.05 → up to 0.985: under 99%
    assert judged["end_frozen"] == {"setups": every, "size": [], "size_undecided": [base, lr],
                                    "direction_setups": every, "direction": [base, lr], "direction_undecided": [pre]}
    # scaled: 5.2 ± 0.2 → 2.66 … 7.74 meets 2.38 … 4.42, and so do lr's and pre's wide interval; the unscaled
    # run above it by seed: base and lr clearly, pre (−5, +15 → 5 ± 10) undecided
    assert judged["scaled_spread"]["size"] == every and judged["scaled_spread"]["direction"] == [base, lr]
    assert judged["scaled_spread"]["direction_undecided"] == [pre]
    # gap: base 6.1 ± 0.1 → 4.83 … 7.37 (helps, too small); lr 17 in both seeds; pre 0.1 ± 0.6: undecided
    assert judged["big_gap"]["direction"] == [base, lr] and judged["big_gap"]["size"] == [lr]
    assert judged["big_gap"]["direction_undecided"] == [pre]


def test_the_gap_direction_needs_its_t_interval_above_zero():
    rows = [row("base", None, "none", 0, 300.0, 0.9, 13.0), row("base", None, "none", 1, 300.0, 0.9, 17.0),
            row("base", None, "inv_sqrt_d", 0, 5.0, 0.2, 10.0), row("base", None, "inv_sqrt_d", 1, 5.0, 0.2, 10.0)]
    g, se, n, _ = sa.gap(*sa.pair(sa.summary_rows(rows), ("base", "base")))
    assert (g, se) == (pytest.approx(5.0), pytest.approx(2.0))  # 2.5 SE: 5 ± 25.4 with 1 degree of freedom
    judged = sa.claims(sa.summary_rows(rows))["big_gap"]
    assert judged["direction"] == [] and judged["direction_undecided"] == [("base", "base")]


def test_a_diverged_run_is_not_an_end_of_training():
    rows = [row("lr", 3e-2, "none", 0, 8000.0, 0.999, None, status="diverged"),
            row("lr", 3e-2, "none", 1, 900.0, 0.95, 30.0),
            row("lr", 3e-2, "inv_sqrt_d", 0, 3.0, 0.1, 10.0), row("lr", 3e-2, "inv_sqrt_d", 1, 3.2, 0.1, 10.2)]
    table = sa.summary_rows(rows)
    none = table[0]
    assert (none["seeds"], none["done"], none["diverged"]) == (2, 1, [(0, 400)])
    assert none["end_spread"] == pytest.approx(900.0) and none["end_spread_se"] is None
    assert sa.claims(table)["end_spread"]["size"] == []  # 8,000 before diverging does not count
    g, se, n, ref = sa.gap(none, table[1])
    assert (g, n, ref) == (pytest.approx(19.8), 1, pytest.approx(10.2))  # paired: seed 1 only


def test_one_study_at_a_time():
    with pytest.raises(ValueError, match="several widths"):
        sa.summary_rows([row("base", None, "none", 0, 300.0, 0.9, 15.0),
                         {**row("base", None, "none", 1, 40.0, 0.5, 5.0), "head_dim": 64}])
    with pytest.raises(ValueError, match="one study at a time"):
        sa.summary_rows([row("base", None, "none", 0, 300.0, 0.9, 15.0), row("base", None, "none", 0, 40.0, 0.5, 5.0)])


def test_a_missing_start_leaves_the_direction_unjudged_not_failed():
    rows = [row("base", None, "none", 0, 6000.0, 0.995, 15.0, start_spread=math.nan)]
    judged = sa.claims(sa.summary_rows(rows))
    assert judged["end_spread"] == {"setups": [("base", "base")], "size": [("base", "base")], "size_undecided": [],
                                    "direction_setups": [], "direction": [], "direction_undecided": []}


def test_explain_names_the_setups_with_their_numbers():
    table = sa.summary_rows(ROWS)
    text = sa.explain("end_spread", table, sa.claims(table))
    assert text == ("setup study (d=1,024, 3 setups, 2 seeds): the size (over 5,000) holds in 0 of 3, 1 undecided, "
                    "the direction (without the scale the spread grows) in 2 of 3, 1 undecided; base setup 320 ± 20")
    gap = sa.explain("big_gap", table, sa.claims(table))
    assert "learning rate 9e-3: +17.00 (seeds identical), 170% of the scaled model's 10.00" in gap
    assert sa.explain("end_spread", [], {}) == ""


def test_unfinished_and_missing_runs_are_not_judged():
    rows = [row("base", None, "none", 0, math.nan, 0.9, None, status="running", layers=[]),
            row("base", None, "inv_sqrt_d", 0, 4.0, 0.1, 9.0)]
    table = sa.summary_rows(rows)
    none = table[0]
    assert none["end_spread"] is None and none["end_spread_max_layer"] is None and none["perplexity"] is None
    judged = sa.claims(table)
    assert judged["end_spread"]["setups"] == [] and judged["big_gap"]["setups"] == []
    assert judged["scaled_spread"]["setups"] == [("base", "base")]  # its size is judged; its direction needs both
    assert judged["scaled_spread"]["direction_setups"] == []


def test_the_text_table_has_a_line_per_setup_and_scale_and_the_claims():
    table = sa.summary_rows(ROWS)
    text = sa.format_text(table, sa.claims(table)).splitlines()
    assert len(text) == 1 + 6 + 1 + 4
    assert text[3].startswith("learning rate 9e-3") and "6,500.0 ±500.0" in text[3] and "99.3% ±0.2%" in text[3]
    column = text[0].index("scale")  # the second column, wherever its width puts it
    assert {line[column:].split()[0] for line in text[1:7]} == {"none", "1/√d"}  # schemes as readers know them
    assert text[-1].startswith("the scale helps perplexity — size by 16.5–18.5 points: in 1 of 3 setups")
