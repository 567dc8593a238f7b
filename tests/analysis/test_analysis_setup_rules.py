"""analysis.setups: the claims' rules at their thresholds, and the texts a reader sees, to the letter.

Most cases use one seed per setup and scale: with one seed there is no interval, so the value itself
decides, and a threshold can be met exactly. Every expected figure is worked out by hand beside it.
"""

import pytest

from attnscale.analysis import setups as sa

BASE, LR = ("base", "base"), ("lr", "9e-3")


def run(axis, value, scale, seed, *, end_spread=300.0, start_spread=20.0, end_frozen=0.9, start_frozen=0.5,
        ppl=15.0, words=1.0, layers=None, status="done"):
    """One study run as ``run_row`` gives it."""
    return {"run": f"{axis}-{value}-{scale}-{seed}", "axis": axis, "value": None if axis == "base" else value,
            "scale": scale, "seed": seed, "head_dim": 1024, "status": status, "steps_done": 400,
            "perplexity": ppl, "settings": {"lr": 3e-3}, "start_spread": start_spread, "end_spread": end_spread,
            "start_frozen_fraction": start_frozen, "end_frozen_fraction": end_frozen,
            "start_effective_words": 5.0, "end_effective_words": words, "end_spread_all_layers": end_spread,
            "end_spread_by_layer": layers if layers is not None else [end_spread]}


def judged(rows, key):
    return sa.claims(sa.summary_rows(rows))[key]


def reading(c, part):
    """How the one setup in ``c`` reads for ``part`` ("size" or "direction"): holds, undecided, fails or unjudged."""
    judged_in = c["setups"] if part == "size" else c["direction_setups"]
    if not judged_in:
        return "unjudged"
    return "holds" if c[part] else "undecided" if c[f"{part}_undecided"] else "fails"


# --- the sizes at their thresholds (one seed: the value itself decides) ---

@pytest.mark.parametrize("end, expected", [(5000.0, "fails"), (5000.01, "holds"), (4999.99, "fails")])
def test_the_end_spread_must_be_over_5000_not_at_it(end, expected):
    assert reading(judged([run("base", None, "none", 0, end_spread=end)], "end_spread"), "size") == expected


@pytest.mark.parametrize("end, expected", [(0.99, "holds"), (0.9899, "fails"), (0.9901, "holds")])
def test_the_frozen_share_reaches_99_percent_at_99_percent(end, expected):
    assert reading(judged([run("base", None, "none", 0, end_frozen=end)], "end_frozen"), "size") == expected


@pytest.mark.parametrize("end, expected", [(2.37, "fails"), (2.38, "holds"), (3.4, "holds"), (4.42, "holds"),
                                           (4.43, "fails"), (5.0, "fails")])
def test_the_scaled_spread_size_is_3_4_within_30_percent_either_side(end, expected):
    # 3.4 × 0.7 = 2.38 and 3.4 × 1.3 = 4.42, both ends inside
    rows = [run("base", None, "none", 0, end_spread=300.0), run("base", None, "inv_sqrt_d", 0, end_spread=end)]
    assert reading(judged(rows, "scaled_spread"), "size") == expected


@pytest.mark.parametrize("ppl_none, expected", [(26.4, "fails"), (26.5, "holds"), (28.5, "holds"), (28.6, "fails")])
def test_the_gap_size_is_16_5_to_18_5_points_ends_included(ppl_none, expected):
    rows = [run("base", None, "none", 0, ppl=ppl_none), run("base", None, "inv_sqrt_d", 0, ppl=10.0)]
    assert reading(judged(rows, "big_gap"), "size") == expected  # gaps 16.4, 16.5, 18.5, 18.6


# --- the directions at zero and just beyond ---

@pytest.mark.parametrize("end, expected", [(20.0, "fails"), (20.5, "holds"), (19.5, "fails")])
def test_the_spread_grows_only_when_its_end_is_above_its_start(end, expected):
    # start 20: a rise of 0 is no growth, a rise of 0.5 is
    rows = [run("base", None, "none", 0, start_spread=20.0, end_spread=end)]
    assert reading(judged(rows, "end_spread"), "direction") == expected


@pytest.mark.parametrize("end, expected", [(0.5, "holds"), (0.75, "holds"), (0.25, "fails")])
def test_frozen_rows_that_stay_as_frozen_count_as_not_falling(end, expected):
    # start 0.5: an end of 0.5 does not fall, so the direction holds; 0.25 falls
    rows = [run("base", None, "none", 0, start_frozen=0.5, end_frozen=end)]
    assert reading(judged(rows, "end_frozen"), "direction") == expected


@pytest.mark.parametrize("unscaled, expected", [(4.0, "fails"), (4.5, "holds"), (3.5, "fails")])
def test_the_scaled_spread_must_be_strictly_below_the_unscaled_one(unscaled, expected):
    # scaled end 4.0: the unscaled run level with it (difference 0) is not above it; 0.5 above is
    rows = [run("base", None, "none", 0, end_spread=unscaled), run("base", None, "inv_sqrt_d", 0, end_spread=4.0)]
    assert reading(judged(rows, "scaled_spread"), "direction") == expected


@pytest.mark.parametrize("ppl_none, expected", [(10.0, "fails"), (10.5, "holds"), (9.5, "fails")])
def test_the_scale_helps_only_with_a_gap_above_zero(ppl_none, expected):
    # scaled 10.0: a gap of 0 does not help, one of 0.5 does
    rows = [run("base", None, "none", 0, ppl=ppl_none), run("base", None, "inv_sqrt_d", 0, ppl=10.0)]
    assert reading(judged(rows, "big_gap"), "direction") == expected


def test_a_scaled_run_alone_has_its_size_judged_and_no_direction():
    rows = [run("base", None, "inv_sqrt_d", 0, end_spread=3.0), run("base", None, "inv_sqrt_d", 1, end_spread=3.2)]
    assert judged(rows, "scaled_spread") == {"setups": [BASE], "size": [BASE], "size_undecided": [],
                                             "direction_setups": [], "direction": [], "direction_undecided": []}
    assert judged(rows, "big_gap")["setups"] == [] and judged(rows, "end_spread")["setups"] == []


# --- the gap ---

def test_the_gap_of_a_missing_scale_is_empty_over_no_seeds():
    table = sa.summary_rows([run("base", None, "none", 0, ppl=15.0)])
    none, scaled = sa.pair(table, BASE)
    assert scaled is None
    assert sa.gap(none, scaled) == (None, None, 0, None)
    assert sa.gap(None, none) == (None, None, 0, None)


# --- value_text: the numbers the report prints beside a claim ---

def value_rows():
    return [
        # base, unscaled: end spread 320.2, 320.6 → 320.4 ± 0.2; frozen 0.93, 0.95 → 94.0% ± 1.0%; ppl 15.2 twice
        run("base", None, "none", 0, end_spread=320.2, end_frozen=0.93, ppl=15.2),
        run("base", None, "none", 1, end_spread=320.6, end_frozen=0.95, ppl=15.2),
        # base, scaled: end spread 5.198, 5.202 → 5.2 ± 0.002; ppl 9.098, 9.102 → 9.1 ± 0.002
        run("base", None, "inv_sqrt_d", 0, end_spread=5.198, ppl=9.098),
        run("base", None, "inv_sqrt_d", 1, end_spread=5.202, ppl=9.102),
        # learning rate 9e-3: the unscaled runs only, end spread 6,000 and 7,000 → 6,500 ± 500
        run("lr", 9e-3, "none", 0, end_spread=6000.0, ppl=27.0), run("lr", 9e-3, "none", 1, end_spread=7000.0, ppl=27.0),
        # norm pre: the scaled runs only, 3.0 and 3.2 → 3.10 ± 0.10
        run("norm", "pre", "inv_sqrt_d", 0, end_spread=3.0), run("norm", "pre", "inv_sqrt_d", 1, end_spread=3.2),
    ]


def test_value_text_prints_each_claims_own_measure_in_its_own_form():
    table = sa.summary_rows(value_rows())
    # an SE the format would round to nothing is shown to two significant digits, the mean to match:
    # 0.2 at no decimals → two decimals; 0.002 at two → four
    assert sa.value_text(table, BASE, "end_spread") == "320.40 ± 0.20"
    assert sa.value_text(table, LR, "end_spread") == "6,500 ± 500"
    assert sa.value_text(table, BASE, "end_frozen") == "94.0% ± 1.0%"
    assert sa.value_text(table, BASE, "scaled_spread") == "5.2000 ± 0.0020"
    assert sa.value_text(table, ("norm", "pre"), "scaled_spread") == "3.10 ± 0.10"
    # gap by seed: 15.2 − 9.098 = 6.102 and 15.2 − 9.102 = 6.098 → +6.1 ± 0.002; 6.1 / 9.1 = 67%
    assert sa.value_text(table, BASE, "big_gap") == "+6.1000 ± 0.0020, 67% of the scaled model's 9.10"


def test_value_text_is_a_dash_where_the_run_it_needs_is_missing():
    table = sa.summary_rows(value_rows())
    pre = ("norm", "pre")  # scaled runs only
    assert sa.value_text(table, pre, "end_spread") == "—"
    assert sa.value_text(table, pre, "end_frozen") == "—"
    assert sa.value_text(table, pre, "big_gap") == "—"
    assert sa.value_text(table, LR, "scaled_spread") == "—"  # unscaled runs only
    assert sa.value_text(table, LR, "big_gap") == "—"


def test_the_gap_pairs_a_run_without_a_recorded_seed_with_its_like():
    # a record that names no seed reads back with seed None; it pairs with the other scale's seed None
    rows = [run("base", None, "none", None, ppl=16.0), run("base", None, "none", 1, ppl=17.0),
            run("base", None, "inv_sqrt_d", None, ppl=10.0), run("base", None, "inv_sqrt_d", 1, ppl=10.0)]
    table = sa.summary_rows(rows)
    g, se, n, ref = sa.gap(*sa.pair(table, BASE))
    # diffs 6 and 7 → 6.5, SE |7 − 6| / 2 = 0.5; the scaled mean 10
    assert (g, se, n, ref) == (pytest.approx(6.5), pytest.approx(0.5), 2, pytest.approx(10.0))
    assert sa.value_text(table, BASE, "big_gap") == "+6.50 ± 0.50, 65% of the scaled model's 10.00"


# --- format_text: the terminal table ---

def test_the_terminal_table_to_the_letter():
    rows = [
        # base, unscaled: 320 ± 20, layers up to 700, 94.0% ± 1.0%, words 1.1 and 1.3 → 1.20, ppl 15.2 ± 0.2
        run("base", None, "none", 0, end_spread=300.0, end_frozen=0.93, words=1.1, ppl=15.0, layers=[100.0, 600.0]),
        run("base", None, "none", 1, end_spread=340.0, end_frozen=0.95, words=1.3, ppl=15.4, layers=[50.0, 700.0]),
        # base, scaled: 5.2 ± 0.02 (one decimal would show 0.0: three), layers up to 7, frozen 20% in both seeds,
        # words 2.0 and 2.5 → 2.25, ppl 9.1 ± 0.002 (two decimals would show 0.00: four)
        run("base", None, "inv_sqrt_d", 0, end_spread=5.18, end_frozen=0.2, words=2.0, ppl=9.098, layers=[2.0, 6.0]),
        run("base", None, "inv_sqrt_d", 1, end_spread=5.22, end_frozen=0.2, words=2.5, ppl=9.102, layers=[3.0, 7.0]),
        # learning rate 9e-3, unscaled: seed 0 done (one value, no SE), seed 1 diverged
        run("lr", 9e-3, "none", 0, end_spread=6000.0, end_frozen=0.995, words=1.05, ppl=26.5, layers=[3000.0, 9000.0]),
        run("lr", 9e-3, "none", 1, end_spread=8000.0, ppl=None, status="diverged"),
        # learning rate 9e-3, scaled: still running, so nothing to show
        run("lr", 9e-3, "inv_sqrt_d", 0, ppl=None, status="running"),
    ]
    claims = {
        "end_spread": {"setups": [BASE, LR], "size": [LR], "size_undecided": [], "direction_setups": [BASE],
                       "direction": [BASE], "direction_undecided": []},
        "end_frozen": {"setups": [], "size": [], "size_undecided": [], "direction_setups": [], "direction": [],
                       "direction_undecided": []},
        "big_gap": {"setups": [BASE], "size": [], "size_undecided": [], "direction_setups": [BASE],
                    "direction": [BASE], "direction_undecided": []},
    }
    # column widths: setup 18 ("learning rate 9e-3"), scale 5, end spread 12 ("5.200 ±0.020"), max layer 9,
    # frozen 17 ("20.0% (identical)"), eff. words 10, valid ppl 14 ("9.1000 ±0.0020"), seeds 5; one space
    # between columns, text to the left, numbers to the right, no trailing spaces
    assert sa.format_text(sa.summary_rows(rows), claims).splitlines() == [
        "setup              scale   end spread max layer            frozen eff. words      valid ppl seeds",
        "base               none   320.0 ±20.0       700       94.0% ±1.0%       1.20    15.20 ±0.20 2/2",
        "base               1/√d  5.200 ±0.020         7 20.0% (identical)       2.25 9.1000 ±0.0020 2/2",
        "learning rate 9e-3 none       6,000.0     9,000             99.5%       1.05          26.50 1/2",
        "learning rate 9e-3 1/√d             -         -                 -          -              - 0/1",
        "end of training: layer 0 (mean over its heads) at the last recorded step, ± SE over seeds; "
        "max layer: the largest layer's spread",
        "without the scale the spread grows — size over 5,000: in 1 of 2 setups; direction: in 1 of 1",
        "the scale helps perplexity — size by 16.5–18.5 points: in 0 of 1 setups; direction: in 1 of 1",
    ]


def test_a_measure_that_is_not_finite_counts_as_missing():
    # no inf or nan reaches a table: the largest finite layer is the max layer, a nan word count shows as missing
    rows = [run("base", None, "none", 0, words=float("nan"), layers=[100.0, float("inf"), float("nan")])]
    (row,) = sa.summary_rows(rows)
    assert row["end_spread_max_layer"] == 100.0 and row["end_effective_words"] is None
    assert sa.format_text([row], {}).splitlines()[1] == "base  none       300.0       100  90.0%          -     15.00 1/1"


# --- setups: the order a reader sees them in ---

def test_setups_put_the_base_first_then_the_axes_in_their_order_by_value_then_the_combinations():
    def r(axis, value):
        return {"axis": axis, "value": value}
    rows = [r("init+norm", ("small", "pre")), r("steps", 1200), r("norm", "pre"), r("weight_decay", None),
            r("lr", 1e-2), r("schedule+steps", ("constant", 400)), r("base", None), r("dropout", 0.1),
            r("weight_decay", 1e16), r("norm", "post"), r("steps", 400), r("init+norm", ("normal", "post")),
            r("weight_decay", 0.1), r("lr", 3e-3)]
    assert sa.setups(rows) == [
        ("base", "base"),
        ("lr", "3e-3"), ("lr", "1e-2"),  # by value: 0.003 < 0.01 (as text "1e-2" would come first)
        # numbers before other values; 1e16 reads "1e+16", a plus sign that is no combination
        ("weight_decay", "0.1"), ("weight_decay", "1e+16"), ("weight_decay", "None"),
        ("norm", "post"), ("norm", "pre"),  # text by text
        ("steps", "400"), ("steps", "1200"),  # 400 < 1200 (as text "1200" would come first)
        ("dropout", "0.1"),  # an axis the study does not know: after the known ones
        ("schedule+steps", "constant + 400"),  # combines axes 2 and 6 of base, lr, schedule, ...: before 4 and 5
        ("init+norm", "normal + post"), ("init+norm", "small + pre"),
    ]


# --- summary_rows: what a row carries, and the refusals ---

def test_summary_rows_refuse_two_widths_in_these_words():
    rows = [run("base", None, "none", 0), dict(run("base", None, "none", 1), head_dim=256)]
    with pytest.raises(ValueError) as got:
        sa.summary_rows(rows)
    assert str(got.value) == "setup-study rows of several widths ([256, 1024]); summarise one study at a time"


def test_summary_rows_refuse_one_seed_twice_in_these_words():
    with pytest.raises(ValueError) as got:
        sa.summary_rows([run("base", None, "none", 0), run("base", None, "none", 0)])
    assert str(got.value) == ("two setup-study runs of the same setup, scale and seed; "
                              "summarise one study at a time")


def test_summary_rows_carry_steps_settings_and_the_all_layer_spread():
    rows = [dict(run("base", None, "none", 0, end_spread=300.0), steps_done=350, end_spread_all_layers=100.0,
                 settings={"lr": 1e-2}),
            dict(run("base", None, "none", 1, end_spread=340.0), steps_done=None, end_spread_all_layers=140.0),
            dict(run("lr", 9e-3, "none", 0, status="running"), steps_done=None)]
    base, lr = sa.summary_rows(rows)
    assert base["steps"] == 350 and lr["steps"] == 0  # the most steps done; none recorded counts as 0
    assert base["settings"] == {"lr": 1e-2}  # the first run's
    # all-layer spread 100 and 140 → mean 120, SE |140 − 100| / 2 = 20, over 2 seeds
    assert (base["end_spread_all_layers"], base["end_spread_all_layers_se"], base["end_spread_all_layers_n"]) == (
        pytest.approx(120.0), pytest.approx(20.0), 2)


# --- explain: the verdict's sentence, to the letter ---

def explain_claims(**c):
    return {"end_spread": {"setups": [], "size": [], "size_undecided": [], "direction_setups": [], "direction": [],
                           "direction_undecided": [], **c}}


def test_explain_with_one_seed_and_nothing_undecided():
    rows = [run("base", None, "none", 0, end_spread=6000.0), run("lr", 9e-3, "none", 0, end_spread=7000.0)]
    table = sa.summary_rows(rows)
    c = explain_claims(setups=[BASE, LR], size=[BASE, LR], direction_setups=[BASE, LR], direction=[BASE])
    assert sa.explain("end_spread", table, c) == (
        "setup study (d=1,024, 2 setups, 1 seed): the size (over 5,000) holds in 2 of 2 "
        "(base: 6,000; learning rate 9e-3: 7,000), the direction (without the scale the spread grows) in 1 of 2; "
        "base setup 6,000")


def test_explain_counts_the_undecided_of_size_and_direction_apart():
    rows = [run("lr", 9e-3, "none", 0, end_spread=6000.0)]  # one row: its width is the first row's
    c = explain_claims(setups=[LR], size_undecided=[LR], direction_setups=[LR])
    assert sa.explain("end_spread", sa.summary_rows(rows), c) == (
        "setup study (d=1,024, 1 setup, 1 seed): the size (over 5,000) holds in 0 of 1, 1 undecided, "
        "the direction (without the scale the spread grows) in 0 of 1")  # no base setup judged: no base part


def test_explain_takes_a_setting_named_base_for_no_base_setup():
    pseudo = ("init", "base")  # an init called "base" is a setting, not the base setup
    rows = [run("init", "base", "none", 0, end_spread=6000.0)]
    c = explain_claims(setups=[pseudo], direction_setups=[pseudo], direction=[pseudo])
    assert sa.explain("end_spread", sa.summary_rows(rows), c) == (
        "setup study (d=1,024, 1 setup, 1 seed): the size (over 5,000) holds in 0 of 1, "
        "the direction (without the scale the spread grows) in 1 of 1")


def test_explain_of_judged_claims_over_an_empty_summary_names_no_width():
    # the summary carries the width; with no rows there is none to name, and no value to quote
    c = explain_claims(setups=[BASE, LR], size=[LR], direction_setups=[BASE, LR], direction=[BASE, LR],
                       direction_undecided=[BASE])
    assert sa.explain("end_spread", [], c) == (
        "setup study (d=?, 2 setups, 0 seeds): the size (over 5,000) holds in 1 of 2 (learning rate 9e-3: —), "
        "the direction (without the scale the spread grows) in 2 of 2, 1 undecided; base setup —")


# --- run_row: one recorded run as plain numbers ---

class Recorded:
    """A stand-in for runs.record.TrainRun with the attributes run_row reads; unknown steps or keys raise."""

    def __init__(self, group, model, train, diagnostics):
        self.group, self.model, self.train, self.diagnostics = group, model, train, diagnostics
        self.run_id, self.scale, self.seed, self.head_dim = "r1", "none", 2, 64
        self.status, self.steps_done, self.perplexity = "done", 400, 15.5

    def line(self, which):
        assert which in ("first", "last")
        return {"step": which} if self.diagnostics else None

    def layer_means(self, which, key):
        return list(self.diagnostics[which][key])  # a KeyError for anything else

    def diag_mean(self, which, key):
        ls = self.diagnostics[which][key]
        return sum(ls) / len(ls)


MODEL, TRAIN = {"init": "small", "norm": "pre"}, {"lr": 3e-3, "min_lr_ratio": 1.0, "weight_decay": 0.1, "steps": 400}
SETTINGS = {"lr": 3e-3, "schedule": "constant", "weight_decay": 0.1, "init": "small", "norm": "pre", "steps": 400}
DIAGNOSTICS = {  # two layers, every figure distinct: layer 0 is the course's
    "first": {"spread": [2.0, 3.0], "frozen_fraction": [0.1, 0.2], "effective_words": [9.0, 8.0]},
    "last": {"spread": [40.0, 60.0], "frozen_fraction": [0.7, 0.8], "effective_words": [1.5, 2.5]},
}


def test_run_row_reads_a_combined_axis_and_layer_zero_at_the_first_and_last_step():
    row = sa.run_row(Recorded("study:lr+norm", MODEL, TRAIN, DIAGNOSTICS))
    assert row == {"run": "r1", "axis": "lr+norm", "value": (3e-3, "pre"), "scale": "none", "seed": 2,
                   "head_dim": 64, "status": "done", "steps_done": 400, "perplexity": 15.5, "settings": SETTINGS,
                   "start_spread": 2.0, "end_spread": 40.0, "start_frozen_fraction": 0.1, "end_frozen_fraction": 0.7,
                   "start_effective_words": 9.0, "end_effective_words": 1.5,
                   "end_spread_all_layers": 50.0,  # (40 + 60) / 2
                   "end_spread_by_layer": [40.0, 60.0]}


def test_run_row_of_the_base_has_no_value_and_without_diagnostics_no_figures():
    row = sa.run_row(Recorded("study:base", MODEL, TRAIN, {}))
    assert row["axis"] == "base" and row["value"] is None and row["settings"] == SETTINGS
    assert [row[f"{end}_{key}"] for end in ("start", "end") for key in ("spread", "frozen_fraction",
                                                                          "effective_words")] == [None] * 6
    assert row["end_spread_all_layers"] is None and row["end_spread_by_layer"] == []
