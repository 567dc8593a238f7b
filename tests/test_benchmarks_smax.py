"""benchmarks/smax_screen.py: a smoke run at tiny sizes, both routes timed and checked against float64."""

import pytest

from attnscale.capture import smax
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("smax_screen.py")


def test_a_smoke_run_times_both_routes_and_checks_them_against_float64(bench, capsys):
    rows = bench.main(["--lengths", "32", "64", "--heads", "2", "--head-dim", "8", "--repeat", "1"])
    out = capsys.readouterr().out
    assert f"SCREEN_FROM {smax.SCREEN_FROM:,}" in out and ("avx512_bf16" in out or "no avx512_bf16" in out)
    assert [r["T"] for r in rows] == [32, 64]
    for r in rows:
        assert r["float32"] > 0 and r["screen"] > 0 and r["ratio"] == pytest.approx(r["screen"] / r["float32"])
        assert r["entries"] == 2 * r["T"] ** 2
        assert r["max_rel_error"] < 1e-6  # the screened number is the float32 one, within float32's rounding
    assert "screen/float32" in out and len(out.splitlines()) == 2 + len(rows)
