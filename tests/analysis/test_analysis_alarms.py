"""analysis/alarms: a run's series read off its record, the study's rows drawn from the runs that finished,
a detector's lead against the loss's own, and the texts the study's tables print, each checked against a
calculation written out here (the study's own judging on hand-made rows: tests/experiments/test_warn_study.py)."""

import statistics

import pytest

from attnscale.analysis import alarms
from attnscale.analysis import detectors as det
from attnscale.analysis import outcomes as oc
from attnscale.runs import record as rec

STEPS = 40


def _run(tmp_path, name: str, *, status: str = "done", family: str | None = None, seed: int = 0,
         losses=None, valid_loss: float | None = 3.3, measured_every: int = 1, kept_losses: bool = True,
         diverged_at: int | None = None) -> rec.TrainRun:
    """A training run as its record reads back: a loss of 3.5 at every step (on the unigram plateau: a
    floor of 3.237 breaks it), every head's measures at every ``measured_every``-th step, the max score
    of head (layer l, head h) at step s being 100 l + 10 h + s."""
    losses = [3.5] * STEPS if losses is None else list(losses)
    model = {"vocab_size": 8, "d_model": 16, "n_heads": 2, **({"family": family} if family else {"scale": "none"})}
    train = {"steps": STEPS, "seed": seed, "lr": 0.1, "warmup": 0}
    lines = []
    for s in range(len(losses)):
        line = {"step": s, "loss": losses[s]}
        if s % measured_every == 0:
            line |= {"max_score": [[100 * l + 10 * h + s for h in range(2)] for l in range(2)],
                     "effective_words": [[2.0, 3.0], [4.0, float("nan")]], "grad_norm": 0.5 + s,
                     "q_rms": [1.0, 2.0], "k_rms": [3.0]}
        lines.append(line)
    results = rec.TrainResults(status, len(losses), diverged_at=diverged_at, valid_loss=valid_loss,
                               losses=tuple(x for x in losses if x is not None) if kept_losses else ())
    path = tmp_path / name
    return rec.TrainRun(path, rec.Record("train", status, {"model": model, "train": train}, None), results, tuple(lines))


def test_a_series_is_the_losses_every_step_and_every_heads_measures_at_each_probe(tmp_path):
    run = _run(tmp_path, "r", losses=[4.0 - 0.01 * s for s in range(STEPS)], valid_loss=2.5)
    s = alarms.series_of(run, probe_every=10)
    assert s.losses == tuple(4.0 - 0.01 * i for i in range(STEPS)) and s.final_loss == 2.5
    assert [p for p, _ in s.probes] == [0, 10, 20, 30]
    step, measures = s.probes[1]
    assert measures["max_score"] == [10.0, 20.0, 110.0, 120.0]  # flattened over layers, layer by layer
    ew = measures["effective_words"]
    assert ew[:3] == [2.0, 3.0, 4.0] and ew[3] != ew[3]  # NaN stays NaN
    assert measures["spread"] == []  # a measure the line has not: no values
    assert measures["grad_norm"] == [10.5] and measures["qk_rms"] == [1.0, 2.0, 3.0]
    assert "log_z" not in measures  # a field the line has not is left out
    assert [p for p, _ in alarms.series_of(run).probes] == list(range(0, STEPS, 5))  # every 5th step by default


def test_a_series_probes_only_steps_that_measured_and_reads_older_records_losses_from_the_history(tmp_path):
    run = _run(tmp_path, "r", measured_every=4, kept_losses=False, losses=[3.0 + s for s in range(STEPS)])
    s = alarms.series_of(run, probe_every=2)
    assert [p for p, _ in s.probes] == list(range(0, STEPS, 4))  # even steps that measured: every 4th
    assert s.losses == tuple(3.0 + i for i in range(STEPS))  # read off the history where the results keep none


def test_an_older_records_series_has_the_loss_of_its_recording_steps_alone(tmp_path):
    """Records from before every step's loss was kept: the history's lines, the steps between them None."""
    run = _run(tmp_path, "r", kept_losses=False)
    run = rec.TrainRun(run.path, run.record, run.results, tuple(x for x in run.history if x["step"] % 4 == 0))
    s = alarms.series_of(run, probe_every=4)
    assert s.losses == tuple(3.5 if i % 4 == 0 else None for i in range(37))  # up to the last line, step 36
    none = rec.TrainRun(run.path, run.record, run.results, ())
    assert alarms.series_of(none).losses == () and alarms.series_of(none).probes == ()


def test_a_measure_that_is_not_a_number_reads_as_nan(tmp_path):
    run = _run(tmp_path, "r")
    lines = [{**x, "max_score": [[None, True], ["7", 2]], "grad_norm": None, "log_z": False, "q_rms": [None],
              "k_rms": None} if x["step"] == 0 else x for x in run.history]
    s = alarms.series_of(rec.TrainRun(run.path, run.record, run.results, tuple(lines)))
    step, measures = s.probes[0]
    assert step == 0 and len(measures["max_score"]) == 4 and measures["max_score"][3] == 2.0
    assert all(v != v for v in measures["max_score"][:3])  # None, a bool and a string are no numbers
    assert all(v != v for v in measures["grad_norm"] + measures["log_z"] + measures["qk_rms"])
    assert len(measures["qk_rms"]) == 1  # k_rms: none


def test_a_diverged_runs_series_ends_with_the_step_whose_loss_was_not_finite(tmp_path):
    run = _run(tmp_path, "r", status="diverged", losses=[3.5] * 30 + [None], valid_loss=None, diverged_at=30)
    s = alarms.series_of(run)
    assert s.losses == (3.5,) * 30 + (None,) and s.steps == 31 and s.final_loss is None
    assert oc.first_round_break(s.losses, s.final_loss, None) == oc.Break(30, "non-finite")


def test_analyse_takes_the_finished_runs_of_the_family_asked_for(tmp_path):
    runs = [_run(tmp_path, "done", seed=0), _run(tmp_path, "diverged", status="diverged", seed=1,
                                                losses=[3.5] * 30 + [None], valid_loss=None, diverged_at=30),
            _run(tmp_path, "failed", status="failed", seed=2), _run(tmp_path, "running", status="running", seed=3),
            _run(tmp_path, "llama", family="llama", seed=4)]
    result = alarms.analyse(runs, None)
    assert [r["run"] for r in result["rows"]] == ["done", "diverged"]  # the tiny LM's by default
    assert result["family"] == "tiny LM" and result["key"] == "tiny"
    assert [r["run"] for r in alarms.analyse(runs, None, family="llama")["rows"]] == ["llama"]
    assert alarms.analyse(runs, None, family="llama")["family"] == "Llama under the HF Trainer"
    rows = {r["run"]: r for r in result["rows"]}
    assert rows["diverged"]["break"] == oc.Break(30, "non-finite") and rows["done"]["break"] is None
    assert rows["done"]["seed"] == 0 and rows["done"]["lr"] == 0.1 and rows["done"]["norm"] == "pre"


def test_analyse_breaks_by_the_floor_and_the_rule_it_is_given_and_probes_at_its_cadence(tmp_path):
    runs = [_run(tmp_path, "plateau")]
    # a loss of 3.5 every step and 3.3 held out, against the line 3.237 - 0.1: no 20-step mean ever falls
    # under it, so the run is broken from its first window's last step, 19
    assert alarms.analyse(runs, 3.237)["rows"][0]["break"] == oc.Break(19, "floor")
    assert alarms.analyse(runs, 3.237)["floor"] == 3.237
    assert alarms.analyse(runs, None)["rows"][0]["break"] is None
    narrow = oc.FirstRoundRule(floor_window=10)
    assert alarms.analyse(runs, 3.237, rule=narrow)["rows"][0]["break"] == oc.Break(9, "floor")
    assert alarms.analyse(runs, 3.237, rule=narrow)["rule"] == narrow
    got = alarms.analyse(runs, None, probe_every=20)
    assert [p for p, _ in got["rows"][0]["series"].probes] == [0, 20] and got["probe_every"] == 20


def _outcome(seed: int, lead: int | None, broken_at: int | None = 100) -> det.Outcome:
    """A run broken at ``broken_at`` (None: healthy) warned ``lead`` steps before (None: no warning)."""
    return det.Outcome(seed, 200, broken_at, None if lead is None else broken_at - lead)


def _difference(leads_a, leads_b, healthy=0):
    a = [_outcome(i, x) for i, x in enumerate(leads_a)] + [_outcome(100 + i, None, None) for i in range(healthy)]
    b = [_outcome(i, x) for i, x in enumerate(leads_b)] + [_outcome(100 + i, None, None) for i in range(healthy)]
    return alarms._lead_difference(a, b)


def _by_hand(diffs):
    """The median difference's percentile interval, resampling seeds as the study does (one run per seed)."""
    return det.bootstrap(list(enumerate(diffs)), lambda sample: statistics.median(d for _, d in sample),
                         seed_of=lambda p: p[0])


def test_a_lead_difference_is_the_median_over_broken_runs_a_miss_counting_zero():
    # differences 10 - 0, 20 - 5, 30 - 10, 0 - 40 (a misses: lead 0), over the broken runs alone
    got = _difference([10, 20, 30, None], [None, 5, 10, 40], healthy=3)
    diffs = [10, 15, 20, -40]
    assert got["median"] == statistics.median(diffs) == 12.5 and got["mean"] == sum(diffs) / 4 == 1.25
    assert got["runs"] == 4 and got["ci"] == pytest.approx(_by_hand(diffs))
    assert got["ci"][0] <= 0 <= got["ci"][1] and got["verdict"] == "inconclusive"
    assert set(got) == {"median", "ci", "verdict", "runs", "mean"}


@pytest.mark.parametrize(("leads_a", "leads_b", "verdict"), [
    ([11, 12, 13, 14], [10, 10, 10, 10], "earlier"),  # every seed 1 to 4 steps earlier: the interval [1, 4]
    ([5, 5, 5, 5], [6, 6, 6, 6], "later"),  # 1 step later in every seed: [-1, -1]
    ([5, 5, 5, 5], [5, 5, 5, 5], "inconclusive"),  # the same step: the interval [0, 0] holds 0
    ([6, 5, 5, 5], [5, 5, 5, 5], "inconclusive"),  # an interval starting at exactly 0
    ([4, 5, 5, 5], [5, 5, 5, 5], "inconclusive"),  # ... and one ending at exactly 0
])
def test_a_lead_difference_is_earlier_or_later_only_where_its_interval_leaves_out_zero(leads_a, leads_b, verdict):
    got = _difference(leads_a, leads_b)
    diffs = [x - y for x, y in zip(leads_a, leads_b)]
    lo, hi = _by_hand(diffs)
    assert got["ci"] == pytest.approx((lo, hi))
    assert got["verdict"] == verdict == ("earlier" if lo > 0 else "later" if hi < 0 else "inconclusive")
    assert got["median"] == statistics.median(diffs) and got["mean"] == sum(diffs) / len(diffs)


def test_a_lead_difference_on_one_seed_has_no_interval_and_is_inconclusive():
    got = _difference([30], [10])
    assert got == {"median": 20, "ci": None, "verdict": "inconclusive", "runs": 1, "mean": 20}


def test_a_lead_difference_where_neither_warns_says_so():
    got = _difference([None, None], [None, None], healthy=2)
    assert got == {"median": None, "ci": None, "verdict": "neither warns", "runs": 2, "mean": None}


def test_texts_print_shares_as_whole_percents_and_steps_as_they_are():
    assert alarms.pct_text(None) == "—" and alarms.pct_text(None, (0.1, 0.2)) == "—"
    assert alarms.pct_text(1.0) == "100%" and alarms.pct_text(0.125) == "12%"
    assert alarms.pct_text(1.0, (1.0, 1.0)) == "100% [100%, 100%]"
    assert alarms.pct_text(0.5, (0.236, 0.764)) == "50% [24%, 76%]"
    assert alarms.steps_text(None) == "—" and alarms.steps_text(None, (1, 2)) == "—"
    assert alarms.steps_text(425) == "425" and alarms.steps_text(12.5) == "12.5"
    assert alarms.steps_text(425.0, (369.0, 698.5)) == "425 [369, 698.5]"


def test_a_rule_reads_each_part_with_its_direction():
    assert alarms.rule_text([("max_score", 1000.0)]) == "max_score > 1000"
    assert alarms.rule_text([("fewest_words", 1.1), ("non_finite", 0.5)]) == "fewest_words < 1.1 or non_finite > 0.5"


def test_breaks_are_counted_by_cell_with_their_reasons_in_the_cells_order():
    def r(scale, lr, reason=None, norm="pre", warmup=20):
        return {"scale": scale, "norm": norm, "warmup": warmup, "lr": lr,
                "break": None if reason is None else oc.Break(5, reason)}

    rows = [r("none", 0.1, "spike"), r("inv_sqrt_d", 0.1), r("none", 0.1, "floor"), r("none", 0.1, "spike"),
            r("none", 0.01), r("none", 0.1, norm="post"), r("none", 0.1, "non-finite", warmup=0), r("none", 0.1)]
    got = alarms.breaks_by_cell({"rows": rows})

    def cell(scale, norm, warmup, lr, runs, broken, reasons):
        return {"scale": scale, "norm": norm, "warmup": warmup, "lr": lr, "runs": runs, "broken": broken,
                "reasons": reasons}

    assert got == [cell("inv_sqrt_d", "pre", 20, 0.1, 1, 0, {}), cell("none", "post", 20, 0.1, 1, 0, {}),
                   cell("none", "pre", 0, 0.1, 1, 1, {"non-finite": 1}), cell("none", "pre", 20, 0.01, 1, 0, {}),
                   cell("none", "pre", 20, 0.1, 4, 3, {"spike": 2, "floor": 1})]


def test_the_default_rule_is_the_best_one_with_non_finite_beside_it_in_the_watchs_order():
    def warn(parts, hits):
        return {"warn": {"parts": parts, "choosing": {"hits": hits}}}

    detectors = {"max_score": warn([("max_score", 1e3)], 3), "frozen": warn([("frozen", 0.9)], 0),
                 "growth": warn([("growth", 3)], 5), "fewest_words": warn([("fewest_words", 1.1)], 1),
                 "head_spike": {"warn": None}}
    # no best rule: every watch alert that warned a choosing run, growth (no alert) and frozen (no hit) left out
    assert alarms.default_parts(detectors, None) == [("max_score", 1e3), ("fewest_words", 1.1), ("non_finite", 0.5)]
    # a best rule of the watch's alerts is taken whole, NonFinite added once
    assert alarms.default_parts(detectors, {"parts": [("non_finite", 0.5), ("frozen", 0.5)]}) == [
        ("frozen", 0.5), ("non_finite", 0.5)]
    # a best rule with a part the watch cannot raise falls back to the alerts that warned
    assert alarms.default_parts(detectors, {"parts": [("growth", 3)]}) == [
        ("max_score", 1e3), ("fewest_words", 1.1), ("non_finite", 0.5)]


def _probed_row(seed: int, broken: bool, tag: str = "", **from_step):
    """200 steps. A broken run stays on the unigram plateau (held-out 3.3 against the floor 3.237: broken at
    step 19), a healthy one learns (held-out 2.5). Each measure given (``max_score``, ``words``, ``frozen``)
    as {step: value} holds that value from that step on in one head (before the first: 50, 3 and 0, as in
    every other head)."""
    def at(measure, s, before):
        steps = [k for k in from_step.get(measure, {}) if k <= s]
        return from_step[measure][max(steps)] if steps else before

    losses = tuple([3.5] * 200) if broken else tuple(4.0 - 1.5 * i / 199 for i in range(200))
    probes = tuple((s, {"max_score": [at("max_score", s, 50.0), 50.0], "effective_words": [at("words", s, 3.0), 3.0],
                        "frozen_fraction": [at("frozen", s, 0.0), 0.0]}) for s in range(0, 200, 5))
    cell = {"scale": "none", "norm": "post", "warmup": 0, "lr": 0.1, "seed": seed}
    return alarms.row(cell, f"{seed}-{broken}-{tag}", det.Series(losses, probes, 3.3 if broken else 2.5), 3.237)


def test_thresholds_are_chosen_on_one_half_of_the_seeds_and_read_on_the_other_and_the_rows_left_as_they_were():
    # seeds 0 and 2 choose, 1 and 3 are held out; every choosing break is warned, one held-out break is not
    warned = {"max_score": {10: 5000.0}, "words": {10: 1.0}}  # a head's max score and fewest words from step 10
    rows = [_probed_row(s, True, **(warned if s != 3 else {})) for s in range(4)] + [
        _probed_row(s, False) for s in range(4)]
    signals = [dict(r["signals"]) for r in rows]
    got = alarms.analyse_rows(rows, 3.237)
    assert (got["choosing_seeds"], got["held_out_seeds"], got["probe_every"]) == ((0, 2), (1, 3), 5)
    for name, threshold in (("max_score", 100), ("fewest_words", 1.001)):  # the first that warns all it can
        warn = got["detectors"][name]["warn"]
        assert warn["choosing"]["threshold"] == threshold and warn["choosing"]["hits"] == 2
        # held out: seed 1's break warned at step 10 (lead 9), seed 3's not; no healthy run warned
        assert (warn["hits"], warn["broken"], warn["false_alarms"], warn["healthy"]) == (1, 2, 0, 2)
        assert warn["lead_median"] == 9
    assert [r["signals"] for r in got["rows"]] == signals  # judging adds nothing to the rows


@pytest.mark.parametrize(("first", "second", "thresholds"), [
    ("words", "frozen", [("fewest_words", 3), ("frozen", 0.25)]),  # neighbours in the detectors' order
    ("max_score", "words", [("max_score", 100), ("fewest_words", 3)]),  # the first detector and the third
])
def test_two_detectors_each_warning_the_breaks_the_other_misses_are_combined(first, second, thresholds):
    """Seeds 0-39; the even ones choose. Of each seed's two breaks one is seen by one detector alone, from
    step 10, the other by the other, and the one-word collapse from step 5 already at 2.5 words (under 3: a
    longer lead at the last threshold). Of the healthy runs, seed 0's sits at 1 word (one false alarm in 20
    for fewest words: the 5% allowed) and seeds 2 and 4 at a frozen share of 0.2 (two in 20: too many under
    0.2)."""
    seen = {"words": {5: 2.5, 10: 1.0}, "frozen": {10: 0.99}, "max_score": {10: 5000.0}}
    rows = []
    for s in range(40):
        rows += [_probed_row(s, True, tag="a", **{first: seen[first]}),
                 _probed_row(s, True, tag="b", **{second: seen[second]}),
                 _probed_row(s, False, words={10: 1.0 if s == 0 else 3.0}, frozen={10: 0.2 if s in (2, 4) else 0.0})]
    got = alarms.analyse_rows(rows, 3.237)
    assert got["choosing_seeds"] == tuple(range(0, 40, 2))
    combined = got["combined"]
    # the first pair in the detectors' order that warns all 40 choosing breaks, within the false alarms allowed,
    # each part at the threshold with the longest median lead (leads 9 and 14: median 11.5) and, of those, the first
    assert combined["parts"] == thresholds
    c = combined["choosing"]
    fa = 1 if "words" in (first, second) else 0
    assert (c["hits"], c["broken"], c["false_alarms"], c["healthy"], c["lead_median"]) == (
        40, 40, fa, 20, 11.5 if "words" in (first, second) else 9)
    assert (combined["hits"], combined["false_alarms"]) == (40, 0)  # held out: seeds 1 to 39
    assert got["best"] is combined
    assert got["default"]["parts"] == thresholds + [("non_finite", 0.5)]  # the watch's default: the best and NonFinite
    # the watch's former defaults, each read on the held-out seeds, and all of them together
    assert {n: f["parts"] for n, f in got["former"].items()} == {
        "max_score": [("max_score", 100)], "fewest_words": [("fewest_words", 2)], "frozen": [("frozen", 0.5)],
        "head_spike": [("head_spike", 6)], "together": [("max_score", 100), ("fewest_words", 2), ("frozen", 0.5),
                                                         ("head_spike", 6), ("non_finite", 0.5)]}


def test_of_two_single_rules_as_good_the_longer_lead_is_the_best():
    """Every break is seen by both; fewest words from step 10 (lead 9), the frozen share from step 5 (14)."""
    rows = [_probed_row(s, True, words={10: 1.0}, frozen={5: 0.99}) for s in range(4)] + [
        _probed_row(s, False) for s in range(4)]
    got = alarms.analyse_rows(rows, 3.237)
    assert got["combined"] is None  # no pair warns more
    assert got["best"]["parts"] == [("frozen", 0.1)] and got["best"]["lead_median"] == 14
    assert got["default"]["parts"] == [("frozen", 0.1), ("non_finite", 0.5)]  # the best alone, not every alert that warns
    assert got["detectors"]["frozen"]["stop"]["choosing"]["threshold"] == 0.1  # 0 false alarms: under 1% too
    # the default rule on the choosing seeds (0 and 2): both breaks warned at step 5 (lead 14), no healthy run
    c = got["default"]["choosing"]
    assert (c["hits"], c["broken"], c["false_alarms"], c["healthy"], c["lead_median"]) == (2, 2, 0, 2, 14)
    # every point of a detector's curves names that detector
    for name, d in got["detectors"].items():
        assert {p["detector"] for p in d["curve_choosing"] + d["curve_held_out"]} == {name}


def test_the_longer_lead_is_the_best_whichever_detector_has_it():
    """As above with the leads the other way round: fewest words from step 5 (lead 14), the frozen share from
    step 10 (9). The best is chosen by hits, then lead, never by the detector's name."""
    rows = [_probed_row(s, True, words={5: 1.0}, frozen={10: 0.99}) for s in range(4)] + [
        _probed_row(s, False) for s in range(4)]
    got = alarms.analyse_rows(rows, 3.237)
    assert got["combined"] is None
    assert [n for n, _ in got["best"]["parts"]] == ["fewest_words"] and got["best"]["lead_median"] == 14


def test_a_study_where_nothing_warns_has_no_best_rule():
    # a healthy run's max score of a million: every max-score threshold fires on it, so that detector has no rule
    rows = [_probed_row(s, broken) for s in range(4) for broken in (True, False)] + [
        _probed_row(0, False, max_score={0: 1e6})]
    got = alarms.analyse_rows(rows, 3.237)
    assert got["best"] is None and got["combined"] is None and got["detectors"]["max_score"]["warn"] is None
    assert got["default"]["parts"] == [("non_finite", 0.5)]  # NonFinite alone
    # each detector with a rule against the loss's own (itself and max score have none): neither warns
    assert set(got["versus_loss"]) == {d.name for d in det.DETECTORS} - {"max_score", "loss_spike"}
    assert {v["verdict"] for v in got["versus_loss"].values()} == {"neither warns"}


def test_a_single_rule_that_warns_one_break_is_a_rule():
    rows = [_probed_row(s, True, words={10: 1.0} if s == 0 else {}) for s in range(4)] + [
        _probed_row(s, False) for s in range(4)]
    got = alarms.analyse_rows(rows, 3.237)
    assert got["best"]["parts"] == [("fewest_words", 1.001)] and got["best"]["choosing"]["hits"] == 1
