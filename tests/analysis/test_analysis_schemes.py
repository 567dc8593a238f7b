"""analysis.schemes: LR sensitivity, logit growth and collapse on hand-built numbers with known answers."""

import math
import statistics

import pytest

from attnscale.analysis import schemes as sa


def test_sensitivity_one_seed_by_hand():
    # lrs 1, 2, 3; init loss 5; finals 3.0, 2.0, 6.0 (above init: counted at 5)
    cells = {(1.0, 0): (3.0, 5.0), (2.0, 0): (2.0, 5.0), (3.0, 0): (6.0, 5.0)}
    out = sa.sensitivity(cells)
    assert out["sensitivity"] == pytest.approx(((3 - 2) + 0 + (5 - 2)) / 3)
    assert out["best_loss"] == 2.0 and out["best_lr"] == 2.0
    assert out["sensitivity_se"] is None and out["seeds"] == 1 and out["diverged"] == 0


def test_a_diverged_run_counts_at_its_loss_at_init_and_seeds_give_an_se():
    cells = {
        (1.0, 0): (3.0, 5.0), (2.0, 0): (2.0, 5.0), (3.0, 0): (None, 5.0),  # seed 0: 4/3 ... (1 + 0 + 3) / 3
        (1.0, 1): (3.5, 4.0), (2.0, 1): (2.5, 4.0), (3.0, 1): (3.0, 4.0),  # seed 1: (1 + 0 + 0.5) / 3 = 0.5
    }
    out = sa.sensitivity(cells)
    s0, s1 = 4 / 3, 0.5
    assert [p["sensitivity"] for p in out["per_seed"]] == pytest.approx([s0, s1])
    assert out["sensitivity"] == pytest.approx((s0 + s1) / 2)
    # SE of a mean of two values: |a − b| / 2
    assert out["sensitivity_se"] == pytest.approx(abs(s0 - s1) / 2)
    assert out["best_loss"] == pytest.approx(2.25) and out["best_loss_se"] == pytest.approx(0.25)
    assert out["diverged"] == 1 and out["runs"] == 6 and out["seeds"] == 2


def test_a_seed_missing_part_of_the_grid_is_left_out():
    cells = {(1.0, 0): (3.0, 5.0), (2.0, 0): (2.0, 5.0), (1.0, 1): (1.0, 5.0)}
    out = sa.sensitivity(cells)
    assert out["seeds"] == 1 and out["sensitivity"] == pytest.approx(0.5)
    curve = sa.loss_curve(cells)
    assert [c["mean"] for c in curve] == [2.0, 2.0] and curve[0]["se"] == pytest.approx(1.0)


def _step(step, loss, logits, words):
    """logits, words: [layer][head]."""
    return {"step": step, "loss": loss,
            "layers": [{"max_score": lg, "effective_words": w} for lg, w in zip(logits, words)]}


def test_run_measures_logit_growth_and_collapse():
    steps = [
        _step(0, 5.0, [[2.0, 3.0], [1.0, 1.5]], [[30.0, 20.0], [25.0, 28.0]]),
        _step(10, 4.0, [[9.0, 3.0], [4.0, 1.0]], [[1.5, 20.0], [3.0, 28.0]]),
        _step(20, 3.5, [[7.0, 12.0], [float("nan"), 1.0]], [[1.9, 1.99], [float("nan"), 2.0]]),
    ]
    m = sa.run_measures(steps)
    assert m["init_loss"] == 5.0
    assert m["max_logit_by_layer"] == [12.0, math.inf]  # a NaN logit counts as blown up
    assert m["max_logit_steps"] == [(0, 3.0), (10, 9.0), (20, math.inf)]
    # below 2 words at some step: layer 0 heads 0 and 1, layer 1 head 0 (NaN); 2.0 itself is not below
    assert m["collapsed_heads"] == 3 and m["heads"] == 4
    assert m["min_effective_words"] == 1.0
    assert sa.run_measures([])["max_logit"] is None


def _run(scale, head_dim, lr, seed, final, logit, words=20.0):
    return {"scale": scale, "head_dim": head_dim, "lr": lr, "seed": seed, "final_loss": final, "init_loss": 5.0,
            "diverged_at": None if final is not None else 7, "max_logit": logit, "min_effective_words": words,
            "collapsed_heads": int(words < 2), "heads": 8}


def test_summary_rows_and_a_reading_generated_from_them():
    runs = []
    for head_dim in (64, 256):
        for seed in (0, 1):
            for lr, base in ((1e-3, 3.0), (1e-2, 2.0), (1e-1, 2.5)):
                runs.append(_run("steady", head_dim, lr, seed, base + 0.01 * seed, 5.0))
                wild = None if (head_dim == 256 and lr == 1e-1) else base + 0.02 * seed
                runs.append(_run("wild", head_dim, lr, seed, wild, 50.0 * lr * head_dim, words=1.5 if lr == 1e-1 else 20.0))
    rows = sa.summary_rows(runs)
    assert [(r["head_dim"], r["scale"]) for r in rows] == [(64, "steady"), (64, "wild"), (256, "steady"), (256, "wild")]
    wild = rows[3]
    assert wild["diverged"] == 2 and wild["diverged_at"] == [7, 7]
    assert wild["sensitivity"] == pytest.approx(((1.0 + 0.0 + 3.0) / 3 + (1.0 + 0.0 + 2.98) / 3) / 2)
    assert wild["max_logit_high_lr"][0] == pytest.approx(50.0 * 0.1 * 256)
    assert wild["collapsed_heads"] == 2 and wild["heads"] == 48
    text = " ".join(sa.reading(rows))
    # two seeds: each scheme's sensitivity with its best loss beside it, and no ranking read from them
    assert "steady 0.337 ± 0.000" not in text and "(best loss 2.005 ± 0.005)" in text
    assert "With 2 seeds no ranking is read" in text and "less sensitive than every other" not in text
    assert "From width 64 to 256, the sensitivity rises for every scheme: most for wild" in text
    assert "wild at width 256: 2 of 6" in text  # divergences
    assert "grow most under wild" in text and "1,280.0" in text
    assert "fewer than 2 effective words" in text


def _three_schemes(per_seed: dict[str, list[float]]):
    """Runs whose sensitivity per seed is the given value: two LRs, losses best and best + 2·value."""
    runs = []
    for scale, values in per_seed.items():
        for seed, v in enumerate(values):
            runs += [_run(scale, 64, 1e-3, seed, 2.0, 1.0), _run(scale, 64, 1e-2, seed, 2.0 + 2 * v, 1.0)]
    return sa.summary_rows(runs)


def test_pairwise_comparisons_are_paired_by_seed_and_holm_corrected():
    rows = _three_schemes({"a": [0.10, 0.12, 0.11], "b": [0.20, 0.25, 0.24], "c": [0.30, 0.28, 0.33]})
    assert rows[0]["sensitivity_by_seed"] == pytest.approx({0: 0.10, 1: 0.12, 2: 0.11})
    tests = {(t["a"], t["b"]): t for t in sa.pairwise(rows, 64)}
    # a − b per seed: −0.10, −0.13, −0.13; mean −0.12, sd 0.017321, SE 0.01; t = −12, 2 df
    ab = tests[("a", "b")]
    assert ab["diff"] == pytest.approx(-0.12) and ab["se"] == pytest.approx(0.01) and ab["t"] == pytest.approx(-12)
    # two-sided p with 2 df: 1 − |t| / sqrt(2 + t²)
    p_ab = 1 - 12 / math.sqrt(2 + 144)
    assert ab["p"] == pytest.approx(p_ab)
    # a − c: −0.20, −0.16, −0.22, mean −0.193333, sd 0.030551, SE 0.017638; b − c: −0.10, −0.03, −0.09
    def p2(diffs):
        m = sum(diffs) / 3
        se = math.sqrt(sum((d - m) ** 2 for d in diffs) / 2 / 3)
        t = abs(m / se)
        return 1 - t / math.sqrt(2 + t * t)
    ps = {("a", "b"): p_ab, ("a", "c"): p2([-0.20, -0.16, -0.22]), ("b", "c"): p2([-0.10, -0.03, -0.09])}
    order = sorted(ps, key=ps.get)  # Holm by hand: ×3, ×2, ×1, running max
    want, run = {}, 0.0
    for k, key in enumerate(order):
        run = max(run, min(1.0, (3 - k) * ps[key]))
        want[key] = run
    for key, t in tests.items():
        assert t["p"] == pytest.approx(ps[key]) and t["p_holm"] == pytest.approx(want[key])
    text = " ".join(sa.reading(rows))
    assert "Of the 3 paired comparisons" in text
    # p = 0.00687 (a−b), 0.00822 (a−c), 0.0785 (b−c); Holm: 0.0206, 0.0206 (the running max), 0.0785
    assert want[("a", "b")] == pytest.approx(0.0206, abs=1e-4) and want[("a", "c")] == pytest.approx(0.0206, abs=1e-4)
    assert want[("b", "c")] == pytest.approx(0.0785, abs=1e-4)
    assert "a is less sensitive than every other scheme" in text and "2 show a difference" in text
    # the same data over 2 seeds: no ranking read at all
    two = _three_schemes({"a": [0.10, 0.12], "b": [0.20, 0.25], "c": [0.30, 0.28]})
    assert "no ranking is read" in " ".join(sa.reading(two))


def test_unigram_loss_by_hand():
    # train 0 0 1 over a vocabulary of 3: add-one p = 3/6, 2/6, 1/6; held out 0 2: (ln 2 + ln 6) / 2
    assert sa.unigram_loss([0, 0, 1], [0, 2], 3) == pytest.approx((math.log(2) + math.log(6)) / 2)


def test_grid_ends_at_the_unigram_plateau_are_flagged_and_stop_the_ranking():
    rows = _three_schemes({"a": [0.10, 0.12, 0.11], "b": [0.20, 0.25, 0.24], "c": [0.30, 0.28, 0.33]})
    curves = {("a", 64): [{"lr": 1e-3, "mean": 2.0}, {"lr": 1e-2, "mean": 3.15}],
              ("b", 64): [{"lr": 1e-3, "mean": 3.5}, {"lr": 1e-2, "mean": 2.4}],
              ("c", 64): [{"lr": 1e-3, "mean": 2.0}, {"lr": 1e-2, "mean": None}]}
    # unigram 3.24, margin 0.1: a's highest end (3.15 ≥ 3.14) and b's lowest (3.5) sit on it; c's do not
    ends = sa.plateau_ends(rows, curves, 3.24)
    assert ends == [("a", 64, "highest", 3.15), ("b", 64, "lowest", 3.5)]
    text = " ".join(sa.reading(rows, unigram=3.24, plateau=ends))
    assert "A unigram model (token frequencies alone) scores 3.240 nats" in text
    assert "a at width 64, highest learning rate (3.150)" in text
    assert "not read as a ranking" in text and "less sensitive than every other" not in text
    # the same rows without a plateau: the ranking of the paired test stands
    assert "a is less sensitive than every other scheme" in " ".join(sa.reading(rows, unigram=3.24, plateau=[]))


_EMPTY_MEASURES = {"init_loss": None, "max_logit_by_layer": [], "max_logit": None, "max_logit_steps": [],
                   "min_effective_words": None, "collapsed_heads": 0, "heads": 0}


def test_run_measures_of_no_step_with_diagnostics_is_empty_and_has_every_key():
    assert sa.run_measures([]) == _EMPTY_MEASURES
    # a step whose layers are an empty list, or that has none, carries no diagnostics: left out
    assert sa.run_measures([{"step": 0, "loss": 5.0, "layers": []}, {"step": 10, "loss": 4.0}]) == _EMPTY_MEASURES


def test_run_measures_on_finite_numbers_gives_every_measure_and_no_other_key():
    steps = [
        _step(0, 5.0, [[2.0, 3.0], [1.0]], [[30.0, 1.5], [2.0]]),
        _step(10, 4.0, [[4.0, 1.0], [6.0]], [[2.5, 3.0], [1.99]]),
    ]
    # layer 0: max(2, 3, 4, 1) = 4; layer 1: max(1, 6) = 6; per step: max(2, 3, 1) = 3, max(4, 1, 6) = 6
    # below 2 words: (layer 0, head 1) at step 0 (1.5), (layer 1, head 0) at step 10 (1.99); 2.0 is not
    assert sa.run_measures(steps) == {"init_loss": 5.0, "max_logit_by_layer": [4.0, 6.0], "max_logit": 6.0,
                                      "max_logit_steps": [(0, 3.0), (10, 6.0)], "min_effective_words": 1.5,
                                      "collapsed_heads": 2, "heads": 3}


def _words_only(loss, **step):
    """A recorded step with effective words but no logits (so its step number is never read)."""
    return {**step, "loss": loss, "layers": [{"effective_words": [3.0]}]}


def test_the_loss_at_init_is_read_only_from_a_finite_loss_at_step_0():
    assert sa.run_measures([_step(0, 5.0, [[1.0]], [[3.0]])])["init_loss"] == 5.0
    # the first recorded step is not step 0 (a resumed or late-recorded run): no loss at init
    assert sa.run_measures([_step(10, 4.0, [[1.0]], [[3.0]])])["init_loss"] is None
    assert sa.run_measures([_step(1, 4.0, [[1.0]], [[3.0]])])["init_loss"] is None
    # a loss that blew up or is missing at step 0 is no loss at init
    for bad in (float("nan"), math.inf, None):
        assert sa.run_measures([_step(0, bad, [[1.0]], [[3.0]])])["init_loss"] is None
    # a step with no step number is read as step 0
    assert sa.run_measures([_words_only(4.5)])["init_loss"] == 4.5
    assert sa.run_measures([_words_only(4.5, step=3)])["init_loss"] is None


def test_layers_that_recorded_no_logits_or_no_effective_words_count_for_nothing():
    # an older record kept only the spread: no logit, no effective words, no head counted
    spread_only = [{"step": 0, "loss": 5.0, "layers": [{"spread": [1.0, 2.0]}]},
                   {"step": 10, "loss": 4.0, "layers": [{"spread": [1.5, 2.5]}]}]
    assert sa.run_measures(spread_only) == {**_EMPTY_MEASURES, "init_loss": 5.0, "max_logit_by_layer": [None]}
    # layer 1 never records logits, and step 10 records none at all: it has no entry in max_logit_steps
    steps = [{"step": 0, "loss": 5.0, "layers": [{"max_score": [2.0], "effective_words": [3.0]},
                                                  {"effective_words": [4.0, 2.0]}]},
             {"step": 10, "loss": 4.0, "layers": [{"effective_words": [1.0]}, {"effective_words": [5.0, 6.0]}]}]
    # heads: 1 + 2 = 3 at the first step; only layer 0's head falls below 2 words (1.0 at step 10)
    assert sa.run_measures(steps) == {"init_loss": 5.0, "max_logit_by_layer": [2.0, None], "max_logit": 2.0,
                                      "max_logit_steps": [(0, 2.0)], "min_effective_words": 1.0,
                                      "collapsed_heads": 1, "heads": 3}


def test_a_scheme_whose_every_run_diverged_has_no_best_learning_rate():
    # every run counted at its loss at init (5): capped losses 5, 5, best 5, sensitivity 0
    out = sa.sensitivity({(1.0, 0): (None, 5.0), (2.0, 0): (None, 5.0)})
    assert out["best_lr"] is None and out["sensitivity"] == 0.0 and out["best_loss"] == 5.0
    assert out["diverged"] == 2 and out["runs"] == 2 and out["seeds"] == 1


def test_summary_rows_read_logits_at_the_grid_ends_and_middle_and_pool_words_and_heads():
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    # one seed, four LRs; max logit 1, 2, 3, 4 by LR; min effective words 5, (none), 1.5, 3.5
    runs = [_run("s", 64, lr, 0, final, logit, words)
            for lr, final, logit, words in zip(lrs, (3.0, 2.5, 2.0, 4.0), (1.0, 2.0, 3.0, 4.0), (5.0, 20.0, 1.5, 3.5))]
    runs[1]["min_effective_words"] = None
    del runs[3]["collapsed_heads"], runs[3]["heads"]  # a run that gives no head counts counts none
    runs += [{**_run("t", 64, lr, 0, 2.0, None), "min_effective_words": None} for lr in lrs]
    s, t = sa.summary_rows(runs)
    # the middle of 4 LRs is the upper one of the two middle (index 4 // 2 = 2): 1e-2
    assert (s["max_logit_low_lr"], s["max_logit_mid_lr"], s["max_logit_high_lr"]) == ((1.0, None), (3.0, None), (4.0, None))
    assert s["min_effective_words"] == 1.5 and s["collapsed_heads"] == 1 and s["heads"] == 8 * 3
    assert t["min_effective_words"] is None and t["max_logit_mid_lr"] == (None, None)
    assert "per_seed" not in s and s["sensitivity_by_seed"] == {0: pytest.approx((1.0 + 0.5 + 0.0 + 2.0) / 4)}


def test_pairwise_compares_only_the_schemes_at_the_given_width_that_have_seeds():
    def row(scale, head_dim, by_seed):
        return {"scale": scale, "head_dim": head_dim, "sensitivity_by_seed": by_seed}

    rows = [row("a", 64, {0: 0.1, 1: 0.3}), row("b", 256, {0: 0.2, 1: 0.2}), row("c", 64, {}),
            row("d", 64, {0: 0.2, 1: 0.2})]
    tests = sa.pairwise(rows, 64)
    # a − d per seed: −0.1, +0.1: mean 0
    assert [(t["a"], t["b"]) for t in tests] == [("a", "d")] and tests[0]["diff"] == pytest.approx(0.0)


def test_a_grid_end_exactly_at_the_plateau_margin_is_on_it_and_a_scheme_without_a_curve_is_skipped():
    rows = [{"scale": s, "head_dim": 64} for s in ("no_curve", "none_finished", "edge", "under")]
    curves = {("none_finished", 64): [{"mean": None}, {"mean": None}],
              ("edge", 64): [{"mean": 3.25}, {"mean": 2.0}],  # 3.5 − 0.25 = 3.25: at the margin
              ("under", 64): [{"mean": 3.2499}, {"mean": 3.0}]}  # just below it
    assert sa.plateau_ends(rows, curves, 3.5, margin=0.25) == [("edge", 64, "lowest", 3.25)]


_LRS = (1e-3, 3e-3, 1e-2, 3e-2)


def _srow(scale, head_dim, sens, best, *, seeds=1, by_seed=None, sens_se=None, best_se=None, runs=4, diverged=0,
          logit=(None, None), collapsed=0, heads=8):
    """A ``summary_rows`` row built by hand."""
    return {"scale": scale, "head_dim": head_dim, "sensitivity": sens, "sensitivity_se": sens_se, "best_loss": best,
            "best_loss_se": best_se, "best_lr": 1e-2, "seeds": seeds, "lrs": list(_LRS), "runs": runs,
            "diverged": diverged, "sensitivity_by_seed": by_seed or {}, "max_logit_high_lr": logit,
            "collapsed_heads": collapsed, "heads": heads}


def _three_widths():
    # sensitivity from width 32 to 256: a 0.25 → 1.25 (+1.0, absent at 64), b 0.5 → 0.2 (−0.3), c 0.1 → 0.6 (+0.5);
    # d only at 256. Scale order (a, b, c) is not the order of the moves (b, c, a).
    return [
        _srow("a", 32, 0.25, 2.0, diverged=2, logit=(5000.0, 1.0), collapsed=3),
        _srow("b", 32, 0.5, 2.9), _srow("c", 32, 0.1, 2.9), _srow("b", 64, 0.9, 2.9), _srow("c", 64, 0.3, 2.9),
        _srow("a", 256, 1.25, 3.0, logit=(50.0, 5.0)), _srow("b", 256, 0.2, 2.5, diverged=1, logit=(1234.5, 10.0)),
        _srow("c", 256, 0.6, 2.75, collapsed=1), _srow("d", 256, 0.35, 2.6, logit=(7.0, None)),
    ]


_EACH = "b 0.200 (best loss 2.500); d 0.350 (best loss 2.600); c 0.600 (best loss 2.750); a 1.250 (best loss 3.000)"
_AFTER_THE_RANKING = [
    "From width 32 to 256, the sensitivity rises most for a (0.250 to 1.250) and falls most for b (0.500 to 0.200).",
    # width 32 holds a lower best loss (2.0), but the best is read at the widest width only
    "The best final loss at width 256 is b's, 2.500 nats (at learning rate 0.01).",
    "Runs diverged (counted at their loss at init): a at width 32: 2 of 4; b at width 256: 1 of 4.",
    # a at width 32 reached 5,000, but logits are compared at the widest width; c recorded none there
    "Attention logits grow most under b: at learning rate 0.03 and width 256 the largest |scaled score| reached "
    "1,234.5, against 7.0 under d.",
    "Heads collapsed (fewer than 2 effective words at some recorded step): a at width 32: 3 of 8 head-runs; "
    "c at width 256: 1 of 8 head-runs.",
]


def test_reading_over_three_widths_with_one_seed_word_for_word():
    assert sa.reading(_three_widths()) == [
        f"At head width 256, across learning rates 0.001 to 0.03, the sensitivity (nats above the best loss on "
        f"average) and best loss of each scheme: {_EACH}. With 1 seed no ranking is read from these (a ranking "
        "needs 3 or more seeds: paired differences over 2 seeds have 1 degree of freedom).",
        *_AFTER_THE_RANKING]


def test_reading_at_the_unigram_plateau_word_for_word():
    plateau = [("a", 256, "highest", 3.0), ("c", 256, "lowest", 2.9)]
    # best final loss at 256: b's 2.5; 2.875 − 2.5 = 0.375
    assert sa.reading(_three_widths(), unigram=2.875, plateau=plateau) == [
        "A unigram model (token frequencies alone) scores 2.875 nats on the held-out split; the best final loss "
        "at width 256 is 0.375 nats below it.",
        "At the unigram plateau (final loss within 0.1 nats of the unigram model's, or above): a at width 256, "
        "highest learning rate (3.000); c at width 256, lowest learning rate (2.900). There the loss measures "
        "under-training or a run knocked back to token frequencies, not a scheme's stability, so the "
        "sensitivities below are not read as a ranking.",
        f"At head width 256, across learning rates 0.001 to 0.03, the sensitivity and best loss of each scheme: {_EACH}.",
        *_AFTER_THE_RANKING]


def test_sensitivity_that_falls_for_one_scheme_and_stays_for_another_falls_for_every_scheme():
    # x: 0.5 → 0.25 (−0.25); y: 0.3 → 0.3 (a change of exactly 0 is no rise)
    rows = [_srow("x", 64, 0.5, 2.0, sens_se=0.05), _srow("y", 64, 0.3, 2.0),
            _srow("x", 256, 0.25, 2.0, sens_se=0.025), _srow("y", 256, 0.3, 2.0)]
    assert sa.reading(rows)[1] == ("From width 64 to 256, the sensitivity falls for every scheme: most for x "
                                   "(0.500 ± 0.050 to 0.250 ± 0.025), least for y (+0.000).")


def test_reading_of_one_scheme_at_one_width_word_for_word():
    head = ("At head width 64, across learning rates 0.001 to 0.03, the sensitivity (nats above the best loss on "
            "average) and best loss of each scheme: solo 0.400 (best loss 2.200).")
    assert sa.reading([_srow("solo", 64, 0.4, 2.2)]) == [
        head + " With 1 seed no ranking is read from these (a ranking needs 3 or more seeds: paired differences "
               "over 2 seeds have 1 degree of freedom).",
        "The best final loss at width 64 is solo's, 2.200 nats (at learning rate 0.01).",
        "No run diverged in 4.",
        "No head fell below 2 effective words in any run."]
    # three seeds, but nothing to compare with: no scheme is shown less sensitive than the others
    three = _srow("solo", 64, 0.4, 2.2, seeds=3, by_seed={0: 0.3, 1: 0.4, 2: 0.5})
    assert sa.reading([three])[0] == head + (" Of the 0 paired comparisons (by seed, Holm-corrected at 5%), "
                                             "0 show a difference. No scheme is shown less sensitive than all the others.")


def test_reading_with_no_complete_grid_says_so():
    want = ["No scheme has a complete learning-rate grid yet, so no sensitivity can be read."]
    assert sa.reading([]) == want and sa.reading([_srow("x", 64, None, None)]) == want


def _two_schemes(a, b):
    return [_srow("a", 64, statistics.fmean(a.values()), 2.0, seeds=3, by_seed=a),
            _srow("b", 64, statistics.fmean(b.values()), 2.0, seeds=3, by_seed=b)]


_HEAD_AB = ("At head width 64, across learning rates 0.001 to 0.03, the sensitivity (nats above the best loss on "
            "average) and best loss of each scheme: a {} (best loss 2.000); b {} (best loss 2.000).")


def test_the_ranking_of_two_schemes_word_for_word():
    # a − b per seed: −0.10, −0.13, −0.13: mean −0.12, SE 0.01, t = −12 on 2 df; p = 1 − 12/√146 = 0.0069
    # (one comparison: Holm leaves it as it is)
    rows = _two_schemes({0: 0.10, 1: 0.12, 2: 0.11}, {0: 0.20, 1: 0.25, 2: 0.24})
    assert sa.reading(rows)[0] == _HEAD_AB.format("0.110", "0.230") + (
        " Of the 1 paired comparisons (by seed, Holm-corrected at 5%), 1 show a difference: a − b = -0.120 "
        "(adjusted p 0.0069). a is less sensitive than every other scheme.")
    # a − b per seed: −0.2, +0.1, −0.2: mean −0.1, SE 0.1, t = −1, p = 1 − 1/√3 = 0.42: no difference shown
    rows = _two_schemes({0: 0.1, 1: 0.3, 2: 0.2}, {0: 0.3, 1: 0.2, 2: 0.4})
    assert sa.reading(rows)[0] == _HEAD_AB.format("0.200", "0.300") + (
        " Of the 1 paired comparisons (by seed, Holm-corrected at 5%), 0 show a difference. "
        "No scheme is shown less sensitive than all the others.")


def test_an_adjusted_p_of_exactly_alpha_shows_no_difference(monkeypatch):
    # p_holm < 0.05 holds, as paired_holm's "inconclusive" at exactly 0.05 reads it
    rows = _two_schemes({0: 0.10, 1: 0.12, 2: 0.11}, {0: 0.20, 1: 0.25, 2: 0.24})
    test = {"a": "a", "b": "b", "diff": -0.12, "se": 0.01, "n": 3, "p": 0.05, "p_holm": 0.05, "interval": (-0.16, -0.08)}
    monkeypatch.setattr(sa, "pairwise", lambda rows, head_dim: [test])
    assert sa.reading(rows)[0].endswith(
        "(by seed, Holm-corrected at 5%), 0 show a difference. No scheme is shown less sensitive than all the others.")
    monkeypatch.setattr(sa, "pairwise", lambda rows, head_dim: [dict(test, p_holm=0.0499)])
    assert sa.reading(rows)[0].endswith(
        "1 show a difference: a − b = -0.120 (adjusted p 0.05). a is less sensitive than every other scheme.")


def test_loss_curves_group_the_runs_by_scheme_and_width_by_hand():
    def r(scale, head_dim, lr, seed, final):
        return {"scale": scale, "head_dim": head_dim, "lr": lr, "seed": seed, "final_loss": final, "init_loss": 5.0}

    runs = [r("none", 64, 1e-2, 0, None), r("none", 64, 1e-3, 0, 2.0), r("none", 64, 1e-3, 1, 2.4),
            r("none", 64, 1e-2, 1, 3.0), r("inv_sqrt_d", 64, 1e-3, 0, 1.5), r("none", 256, 1e-3, 0, 1.0)]
    curves = sa.loss_curves(runs)
    assert list(curves) == [("none", 64), ("inv_sqrt_d", 64), ("none", 256)]  # in the order first seen
    (low, high) = curves[("none", 64)]
    # lr 1e-3: finals 2.0 and 2.4, mean 2.2, SE |2.4 − 2.0| / 2 = 0.2; lr 1e-2: seed 0 diverged, seed 1 at 3.0
    assert (low["lr"], low["mean"], low["se"], low["runs"], low["diverged"]) == (1e-3, pytest.approx(2.2), pytest.approx(0.2), 2, 0)
    assert (high["lr"], high["mean"], high["se"], high["runs"], high["diverged"]) == (1e-2, 3.0, None, 2, 1)
    assert curves[("inv_sqrt_d", 64)] == [{"lr": 1e-3, "mean": 1.5, "se": None, "runs": 1, "diverged": 0}]
    assert curves[("none", 256)] == [{"lr": 1e-3, "mean": 1.0, "se": None, "runs": 1, "diverged": 0}]
    assert sa.loss_curves([]) == {}


def test_every_difference_that_holds_is_listed():
    rows = _three_schemes({"a": [0.10, 0.12, 0.11], "b": [0.20, 0.25, 0.24], "c": [0.30, 0.28, 0.33]})
    # Holm-adjusted p 0.0206 for a − b and a − c (worked out in the pairwise test above); a − c = −0.193
    assert (" Of the 3 paired comparisons (by seed, Holm-corrected at 5%), 2 show a difference: a − b = -0.120 "
            "(adjusted p 0.021); a − c = -0.193 (adjusted p 0.021). a is less sensitive than every other scheme.") in \
        sa.reading(rows)[0]


def test_run_row_gives_a_runs_settings_final_loss_loss_at_init_and_measures():
    from types import SimpleNamespace

    def run(recorded, model, status, diverged_at=None):
        return SimpleNamespace(recorded=recorded, model_config=SimpleNamespace(**{"context": None, **model}),
                               results=SimpleNamespace(valid_loss=3.25),
                               status=status, run_id="r1", scale="inv_sqrt_d", head_dim=64, seed=1, lr=0.01,
                               diverged_at=diverged_at)

    done = run([_step(0, 4.5, [[2.0]], [[3.0]])], {"vocab_size": 50, "context": 32}, "done")
    assert sa.run_row(done) == {
        "run": "r1", "scale": "inv_sqrt_d", "head_dim": 64, "seed": 1, "lr": 0.01, "status": "done",
        "final_loss": 3.25, "diverged_at": None, "context": 32, "init_loss": 4.5, "max_logit_by_layer": [2.0],
        "max_logit": 2.0, "max_logit_steps": [(0, 2.0)], "min_effective_words": 3.0, "collapsed_heads": 0, "heads": 1}
    # no recorded step: the loss at init is ln(50) = 3.912023005428146, a uniform guess over the vocabulary;
    # a run that is not done has no final loss
    diverged = sa.run_row(run([], {"vocab_size": 50}, "diverged", diverged_at=7))
    assert diverged == {"run": "r1", "scale": "inv_sqrt_d", "head_dim": 64, "seed": 1, "lr": 0.01,
                        "status": "diverged", "final_loss": None, "diverged_at": 7, "context": None,
                        **_EMPTY_MEASURES, "init_loss": pytest.approx(3.912023005428146)}
