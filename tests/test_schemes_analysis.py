"""schemes_analysis: LR sensitivity, logit growth and collapse on hand-built numbers with known answers."""

import math

import pytest

from attnscale.report import schemes_analysis as sa


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


def _run(scale, width, lr, seed, final, logit, words=20.0):
    return {"scale": scale, "width": width, "lr": lr, "seed": seed, "final_loss": final, "init_loss": 5.0,
            "diverged_at": None if final is not None else 7, "max_logit": logit, "min_effective_words": words,
            "collapsed_heads": int(words < 2), "heads": 8}


def test_summary_rows_and_a_reading_generated_from_them():
    runs = []
    for width in (64, 256):
        for seed in (0, 1):
            for lr, base in ((1e-3, 3.0), (1e-2, 2.0), (1e-1, 2.5)):
                runs.append(_run("steady", width, lr, seed, base + 0.01 * seed, 5.0))
                wild = None if (width == 256 and lr == 1e-1) else base + 0.02 * seed
                runs.append(_run("wild", width, lr, seed, wild, 50.0 * lr * width, words=1.5 if lr == 1e-1 else 20.0))
    rows = sa.summary_rows(runs)
    assert [(r["width"], r["scale"]) for r in rows] == [(64, "steady"), (64, "wild"), (256, "steady"), (256, "wild")]
    wild = rows[3]
    assert wild["diverged"] == 2 and wild["diverged_at"] == [7, 7]
    assert wild["sensitivity"] == pytest.approx(((1.0 + 0.0 + 3.0) / 3 + (1.0 + 0.0 + 2.98) / 3) / 2)
    assert wild["max_logit_high_lr"][0] == pytest.approx(50.0 * 0.1 * 256)
    assert wild["collapsed_heads"] == 2 and wild["heads"] == 48
    text = " ".join(sa.reading(rows))
    assert "least sensitive scheme is steady" in text and "most sensitive is wild" in text
    assert "more than 2 standard errors apart" in text
    assert "From width 64 to 256, the sensitivity rises for every scheme: most for wild" in text
    assert "wild at width 256: 2 of 6" in text  # divergences
    assert "grow most under wild" in text and "1,280.0" in text
    assert "fewer than 2 effective words" in text
