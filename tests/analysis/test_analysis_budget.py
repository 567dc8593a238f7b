"""analysis.budget: what a group of runs was given, read from their records and put in words."""

from __future__ import annotations

from attnscale.analysis import budget


def test_span_text_writes_sorted_values_in_words():
    assert budget.span_text([]) == "?"
    assert budget.span_text([64]) == "64"
    assert budget.span_text([64, 256]) == "64 and 256"  # two values: both named
    # three or more: the ends only, with thousands separators by default
    assert budget.span_text([32, 64, 1024]) == "32 to 1,024"
    assert budget.span_text([32, 64, 128, 2048]) == "32 to 2,048"
    assert budget.span_text([1000, 2000]) == "1,000 and 2,000"
    assert budget.span_text(["3e-4", "1e-3", "3e-2"], "{}") == "3e-4 to 3e-2"
    assert budget.span_text([0.5], "{:.2f}") == "0.50"


def _train_run(seed, head_dim, lr, steps=60, context=32, batch=8):
    from types import SimpleNamespace
    # the typed configs a record gives (runs.record.TrainRun.train_config and model_config)
    return SimpleNamespace(seed=seed, head_dim=head_dim, lr=lr, train_config=SimpleNamespace(steps=steps, batch=batch),
                           model_config=SimpleNamespace(context=context))


def test_budget_reads_the_distinct_settings_sorted_and_skips_missing_ones():
    runs = [_train_run(1, 256, 3e-2, steps=120), _train_run(0, 64, 3e-4), _train_run(1, 64, None, batch=None),
            _train_run(0, 256, 1e-3, context=64)]
    assert budget.budget(runs) == {"runs": 4, "steps": [60, 120], "context": [32, 64], "batch": [8],
                                   "seeds": [0, 1], "head_dims": [64, 256], "lrs": [3e-4, 1e-3, 3e-2]}
    assert budget.budget([]) == {"runs": 0, "steps": [], "context": [], "batch": [], "seeds": [],
                                 "head_dims": [], "lrs": []}


def test_budget_text_names_each_setting_in_words():
    b = {"steps": [60], "context": [32], "seeds": [0, 1], "head_dims": [64, 256], "lrs": [3e-4, 1e-3, 3e-3, 3e-2]}
    assert budget.budget_text(b) == ("60 steps a run, context 32, 2 seeds, widths 64 and 256, "
                                     "4 learning rates from 3e-4 to 3e-2")
    b3 = dict(b, lrs=[3e-4, 1e-3, 3e-2])  # three rates: the count and the ends
    assert budget.budget_text(b3) == ("60 steps a run, context 32, 2 seeds, widths 64 and 256, "
                                      "3 learning rates from 3e-4 to 3e-2")
    one = {"steps": [60, 120], "context": [32, 64, 128], "seeds": [7], "head_dims": [64], "lrs": [1e-3, 3e-3]}
    assert budget.budget_text(one) == ("60 and 120 steps a run, context 32 to 128, 1 seed, width 64, "
                                       "learning rates 1e-3 and 3e-3")
    assert budget.budget_text(dict(one, lrs=[9.5e-4])) == ("60 and 120 steps a run, context 32 to 128, 1 seed, "
                                                            "width 64, learning rate 9.5e-4")
    many = {"steps": [400], "context": [64], "seeds": [0, 1, 2], "head_dims": [32, 64, 1024], "lrs": []}
    assert budget.budget_text(many) == "400 steps a run, context 64, 3 seeds, widths 32 to 1,024"
