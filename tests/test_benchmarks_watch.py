"""benchmarks/watch_overhead.py: its estimator against hand calculations, and a smoke run whose printed
figure is the mean of the pairs it prints."""

import json
import re
import statistics

import pytest

from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("watch_overhead.py")


@pytest.mark.parametrize("p, df, table", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776),
                                          (0.975, 19, 2.093), (0.95, 3, 2.353), (0.995, 10, 3.169)])
def test_t_quantile_matches_the_printed_tables(bench, p, df, table):
    assert bench.t_quantile(p, df) == pytest.approx(table, abs=5e-4)


def test_blocks_alternate_abba(bench):
    assert [bench.gate_on(b) for b in range(8)] == [True, False, False, True, True, False, False, True]


def test_window_excess_is_over_the_median_of_the_steps_just_before(bench):
    every = 10
    steps = {s: 1.0 for s in range(1, 24)}
    steps[5] = 9.0  # a neighbour's burst before the window: the median does not move
    steps[10], steps[11], steps[12] = 4.0, 2.0, 1.5  # probe, its log, the refill: 3 + 1 + 0.5 over the median
    assert bench.window_excess(steps, 1, every) == pytest.approx((4.5, 1.0))
    # the baseline is local: the machine slowed by half before block 2, and only its own steps count;
    # steps 11 and 12 are block 1's window, so they are not in block 2's baseline
    for s in range(13, 24):
        steps[s] = 1.5
    steps[20] = 2.5
    assert bench.window_excess(steps, 11, every) == pytest.approx((1.0, 1.5))
    assert bench.window_excess(steps, 11, every, local=3) == pytest.approx((1.0, 1.5))


def test_pair_overheads_put_with_over_without_in_abba_order(bench):
    every, warmup = 10, 10
    steps = {s: 1.0 for s in range(1, warmup + 4 * every + 4)}
    for s in range(warmup + 2 * every + 3, warmup + 4 * every + 4):
        steps[s] = 2.0  # the machine halves its speed after pair 0 (its window included): pair 1 takes 2 s a step
    steps[warmup + every] += 2.0  # block 0 ("with", pair 0): 2 s more at its probe
    steps[warmup + 2 * every] += 0.5  # block 1 ("without", pair 0): 0.5 s more at its log
    steps[warmup + 4 * every] += 1.0  # block 3 ("with", pair 1): 1 s more at its probe
    assert bench.pair_overheads(steps, warmup, every, 2) == pytest.approx([(2 - 0.5) / (10 * 1.0), 1 / (10 * 2.0)])


def test_summary_is_a_t_interval_of_the_pair_means(bench):
    pairs = [0.01, 0.02, 0.0, 0.015, 0.005]
    mean, sd = 0.01, statistics.stdev(pairs)  # sd of these five: sqrt(2.5e-4 / 4)
    s = bench.summarize(pairs)
    assert sd == pytest.approx((2.5e-4 / 4) ** 0.5)
    assert s["mean"] == pytest.approx(mean)
    assert s["high"] - s["mean"] == pytest.approx(2.776 * sd / 5 ** 0.5, rel=2e-4)  # t(0.975, 4) = 2.776


@pytest.mark.parametrize("low, high, word", [(0.002, 0.008, "at most 1%"), (0.012, 0.02, "more than 1%"),
                                             (0.004, 0.014, "inconclusive")])
def test_verdict_reads_the_interval(bench, low, high, word):
    assert bench.verdict({"mean": (low + high) / 2, "low": low, "high": high}).startswith(word)


@pytest.mark.hf
def test_smoke_run_prints_pairs_and_their_mean(bench, tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--every", "6", "--pairs", "2", "--layers", "1", "--hidden", "32", "--heads", "4",
                       "--kv-heads", "2", "--batch", "2", "--context", "16", "--threads", "1",
                       "--save", "steps.json"]) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "steps.json").read_text())
    assert saved["every"] == 6 and saved["warmup"] == 6 and len(saved["wall"]) == 6 + 2 * 2 * 6 + 3 - 1
    assert 0 < saved["idle_call_seconds"] < 1e-3
    assert "avx512_bf16" in out
    for clock in ("wall", "cpu"):
        pairs = [float(x) for x in re.search(rf"^{clock} pairs \(probe windows\): (.*)$", out, re.M).group(1)
                 .replace("%", "").split()]
        mean, low, high, per_step = (float(x) for x in re.search(
            rf"^{clock} overhead: ([+-][\d.]+)% \[95% t interval ([+-][\d.]+)%, ([+-][\d.]+)%\] over 2 pairs, the "
            r"calls between probes \(([\d.]+)%\) included", out, re.M).groups())
        step_ms = float(re.search(r"against a median step of ([\d.]+) ms", out).group(1))
        assert per_step == pytest.approx(100 * saved["idle_call_seconds"] / (step_ms / 1e3) * 5 / 6, rel=0.01, abs=1e-4)
        # the mean is the pairs' mean plus the calls between probes, each printed to 0.01
        assert len(pairs) == 2 and mean == pytest.approx(statistics.fmean(pairs) + per_step, abs=0.011)
        steps = {int(k): v for k, v in saved[clock].items()}
        assert [100 * o for o in bench.pair_overheads(steps, 6, 6, 2, saved["local"])] == pytest.approx(pairs, abs=0.006)
        half = 12.706 * statistics.stdev(pairs) / 2 ** 0.5
        assert high - mean == pytest.approx(half, abs=0.08)  # t(0.975, 1) × |a − b| / 2, pairs printed to 0.01
        assert re.search(rf"^{clock} verdict: ", out, re.M)
    assert float(re.search(r"watch's own timer: ([\d.]+) s", out).group(1)) > 0
