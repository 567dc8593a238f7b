"""benchmarks/qk_clip_overhead.py at smoke size: it runs both models, and its ratios are those of its medians."""

import re

import pytest

from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("qk_clip_overhead.py")


def test_summary_is_medians_their_ratio_and_the_median_of_each_rounds_ratio(bench):
    s = bench.summarize([10.0, 12.0, 11.0], [10.5, 13.0, 12.1])
    assert (s["plain"], s["clipped"]) == (11.0, 12.1) and s["ratio"] == pytest.approx(1.1)
    # rounds' own ratios 1.05, 13/12 = 1.0833 and 1.1: their median
    assert s["paired"] == pytest.approx(13 / 12)


@pytest.mark.hf
def test_smoke_run_prints_both_models_and_consistent_ratios(bench, capsys):
    pytest.importorskip("transformers")
    assert bench.main(["--steps", "2", "--rounds", "1", "--layers", "1", "--hidden", "16", "--heads", "2",
                       "--batch", "2", "--context", "8"]) == 0
    out = capsys.readouterr().out
    for name in bench.MODELS:
        line = next(line for line in out.splitlines() if line.startswith(f"{name} median"))
        a, b, ratio = (float(x) for x in re.search(r"CPU without ([\d.]+) s, with ([\d.]+) s, ratio ([\d.]+)", line).groups())
        # the times print to 0.00005 s and the ratio to 0.0005: at smoke size a step takes milliseconds, so
        # the times' rounding alone can move b / a by a few percent; that much, and no more, may differ
        assert b / a == pytest.approx(ratio, abs=(b / a) * (0.00005 / a + 0.00005 / b) + 0.0005)
        # one round: its own ratio is the ratio of the medians
        paired = float(re.search(r"median of the rounds' own ratios ([\d.]+)\)", line).group(1))
        assert paired == pytest.approx(ratio, abs=0.0011)
