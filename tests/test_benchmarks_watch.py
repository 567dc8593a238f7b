"""benchmarks/watch_overhead.py at smoke size: it runs, and the ratio it prints is the ratio of its medians."""

import importlib.util
import re
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "watch_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("watch_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_is_medians_and_their_ratio(bench):
    s = bench.summarize([10.0, 12.0, 11.0], [10.2, 12.6, 11.1], [0.1, 0.12, 0.05])
    assert s["plain_s"] == 11.0 and s["watched_s"] == 11.1
    assert s["overhead"] == pytest.approx(0.1 / 11.0)
    assert s["own_share"] == pytest.approx(statistics.median([0.1 / 10.2, 0.12 / 12.6, 0.05 / 11.1]))


@pytest.mark.hf
def test_smoke_run_prints_rounds_and_a_consistent_ratio(bench, tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--steps", "2", "--every", "2", "--rounds", "1", "--layers", "1", "--hidden", "32",
                       "--heads", "4", "--kv-heads", "2", "--batch", "2", "--context", "16"]) == 0
    out = capsys.readouterr().out
    assert "avx512_bf16" in out
    rounds = [tuple(map(float, m)) for m in re.findall(
        r"without ([\d.]+) s, with ([\d.]+) s \(watch's own timer ([\d.]+) s\); CPU without ([\d.]+) s, with ([\d.]+) s", out)]
    assert len(rounds) == 1 and all(r[2] > 0 for r in rounds)
    wall, cpu = (float(x) for x in re.findall(r"ratio ([\d.]+)", out))

    def check(printed: float, plain: float, watched: float) -> None:
        # the times are printed rounded to 0.0005 and the ratio to 0.00005: that much, and no more, may differ
        want = watched / plain
        assert printed == pytest.approx(want, abs=want * (0.0005 / plain + 0.0005 / watched) + 0.00005)

    (plain, watched, _, cpu_plain, cpu_watched), = rounds
    check(wall, plain, watched)
    check(cpu, cpu_plain, cpu_watched)
