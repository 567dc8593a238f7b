"""The end-state rule, pinned by hand-made records: each verdict, and the shares it reads."""

import pytest

from attnscale.analysis import end_state as rule
from attnscale.analysis.gaps import course_shares, floor_ppl, gap_table, share_of_value, value_shares


def row(w, scale, seed, ppl, series=()):
    return {"head_dim": w, "scale": scale, "seed": seed, "perplexity": ppl, "steps": 7200, "evals": [],
            "series": [{"step": s, "spread": sp, "frozen": fr} for s, sp, fr in series]}


def runs(unscaled=((5200, 5500.0, 0.995), (7200, 6000.0, 0.995)), scaled=((5200, 3.1, 0.0), (7200, 3.0, 0.0)),
         ppl_1024=(12.0, 6.0), ppl_128=(6.5, 6.0), floor=12.0):
    """Two seeds at 1,024, a pair and the uniform floor at 128; by default every claim of the course met:
    V = 12 − 6 = 6 at both widths, so the gap 6 at 1,024 is a share of 1 and 0.5 at 128 one of 0.083."""
    out = []
    for seed in (0, 1):
        out.append(row(1024, "none", seed, ppl_1024[0], unscaled))
        out.append(row(1024, "inv_sqrt_d", seed, ppl_1024[1], scaled))
    out += [row(128, "none", 0, ppl_128[0]), row(128, "inv_sqrt_d", 0, ppl_128[1]), row(128, "uniform", 0, floor)]
    return out


def test_every_claim_met_is_consistent():
    j = rule.judge(runs())
    assert j["verdict"] == rule.CONSISTENT and all(c["met"] for c in j["claims"])
    assert j["shares"][1024]["share"] == pytest.approx(6 / 6) and j["shares"][128]["share"] == pytest.approx(0.5 / 6)
    assert j["floor"] == 12.0
    assert rule.verdict_lines(j)[-1].startswith("verdict: consistent")


def test_a_ratio_that_stays_low_and_flat_is_inconsistent():
    # ratio 300 / 4 = 75 at step 5,200 and 310 / 4 = 77.5 at 7,200: under 1,000, +3.3%
    j = rule.judge(runs(unscaled=((5200, 300.0, 0.9), (7200, 310.0, 0.9)), scaled=((5200, 4.0, 0), (7200, 4.0, 0))))
    assert j["verdict"] == rule.INCONSISTENT and "ratio stays under 1,000" in j["why"]
    assert j["tails"][0]["growth"] == pytest.approx(310 / 300 - 1) and j["tails"][1]["end"] == pytest.approx(77.5)
    assert [c["met"] for c in j["claims"]] == [False, False, True, True, True]


def test_a_knee_at_128_is_inconsistent_whatever_the_end_state():
    j = rule.judge(runs(ppl_128=(9.6, 6.0)))  # gap 3.6 of V = 6: share 0.6
    assert j["verdict"] == rule.INCONSISTENT and "share at d = 128 is 0.60" in j["why"]


def test_a_ratio_still_growing_but_short_of_the_course_is_undecided_with_what_would_decide_it():
    # ratio 2,000 / 3 = 667 at 5,200, 3,000 / 3 = 1,000 at 7,200: +50%, not stalled; spread under 5,000
    j = rule.judge(runs(unscaled=((5200, 2000.0, 0.995), (7200, 3000.0, 0.995)), scaled=((5200, 3.0, 0), (7200, 3.0, 0))))
    assert j["verdict"] == rule.UNDECIDED and "unscaled spread" in j["why"]
    assert "longer constant phase" in j["would_decide"]


def test_one_seed_that_misses_is_enough_to_miss_and_a_missing_run_is_not_measured():
    rows = runs()
    rows[0] = row(1024, "none", 0, 12.0, ((5200, 5500.0, 0.995), (7200, 4900.0, 0.995)))
    assert rule.judge(rows)["claims"][0]["met"] is False
    no_floor = [r for r in runs() if r["scale"] != "uniform"]
    j = rule.judge(no_floor)
    assert j["floor"] is None and j["claims"][3]["met"] is None and j["verdict"] == rule.UNDECIDED


def test_the_share_of_what_attention_is_worth_by_hand():
    assert share_of_value(2.0, 10.2, 6.2) == pytest.approx(0.5)
    assert share_of_value(2.0, 6.0, 6.2) is None and share_of_value(None, 10.0, 6.0) is None  # nothing to share
    # two seeds at 128: gaps 8 − 6 = 2 and 9 − 6.5 = 2.5, mean 2.25; scaled mean 6.25; V = 10.25 − 6.25 = 4
    rows = [{"lr": None, "head_dim": 128, "scale": s, "seed": seed, "valid_ppl": p, "status": "done"}
            for s, seed, p in (("none", 0, 8.0), ("none", 1, 9.0), ("inv_sqrt_d", 0, 6.0), ("inv_sqrt_d", 1, 6.5))]
    assert value_shares(gap_table(rows), 10.25) == {128: pytest.approx(2.25 / 4)}
    # the course's gaps over its 17.5-point plateau: 2 points at 128 is 0.114, 17.5 at 1,024 is 1
    assert course_shares()[128] == pytest.approx(2 / 17.5) and course_shares()[1024] == 1.0 and course_shares()[32] == 0


def test_a_share_needs_a_floor_above_the_scaled_model_and_is_read_at_the_first_learning_rate():
    assert share_of_value(2.0, 6.2, 6.2) is None  # a floor equal to the scaled model: attention worth nothing
    assert value_shares({"rows": []}, 10.0) == {}
    # two learning rates: the table's first (1e-3, listed first) gives the share, the other is left out
    rows = [{"lr": lr, "head_dim": 64, "scale": s, "seed": 0, "valid_ppl": p, "status": "done"}
            for lr, s, p in ((1e-3, "none", 9.0), (1e-3, "inv_sqrt_d", 6.0), (3e-3, "none", 7.0), (3e-3, "inv_sqrt_d", 6.5))]
    table = gap_table(rows)
    assert [r["lr"] for r in table["rows"]] == [1e-3, 3e-3]
    assert value_shares(table, 10.0) == {64: pytest.approx(3 / 4)}  # (9 − 6) / (10 − 6)


def test_the_floor_is_the_mean_of_the_finished_uniform_runs():
    rows = [{"scale": "uniform", "valid_ppl": 10.0}, {"scale": "uniform", "valid_ppl": 11.5},
            {"scale": "uniform", "valid_ppl": None}, {"scale": "none", "valid_ppl": 3.0}]
    assert floor_ppl(rows) == pytest.approx(10.75) and floor_ppl(rows, scale="none") == 3.0
    assert floor_ppl(rows[2:3]) is None and floor_ppl([]) is None


def test_two_seeds_give_the_gap_a_t_interval_with_one_degree_of_freedom():
    rows = runs()
    assert (rows[2]["head_dim"], rows[2]["scale"], rows[2]["seed"]) == (1024, "none", 1)
    rows[2] = {**rows[2], "perplexity": 10.0}
    j = rule.judge(rows)
    # gaps 12 − 6 = 6 and 10 − 6 = 4: mean 5, SE |6 − 4| / 2 = 1, t(0.975, 1) = 12.706205 (printed tables)
    lo, hi = j["shares"][1024]["interval"]
    assert (lo, hi) == (pytest.approx(5 - 12.706205, abs=1e-5), pytest.approx(5 + 12.706205, abs=1e-5))
    line = next(x for x in rule.verdict_lines(j) if x.startswith("gap at d = 1,024"))
    assert "+5.00 points (2 seeds (+6.00, +4.00), 95% t interval -7.71 to +17.71, so its sign is not settled" in line
    assert next(x for x in rule.verdict_lines(j) if x.startswith("gap at d = 128")).endswith("(1 seed, no interval)")
