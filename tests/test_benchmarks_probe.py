"""benchmarks/probe_cost.py: its memory reading against a known allocation, its table by hand, and a smoke run."""

import sys

import pytest
import torch

from benchmark_scripts import load_benchmark

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("probe_cost.py")


def test_peak_extra_sees_a_known_allocation_that_is_gone_after(bench):
    def allocate():
        x = torch.ones(64 << 18)  # 64 MiB of float32, touched
        return float(x[-1])

    _, _, peak = bench.peak_extra(allocate)
    assert 60 << 20 <= peak <= 80 << 20


def test_the_table_divides_by_the_step_of_the_same_length(bench):
    rows = [{"T": 8, "case": "train step", "seconds": 2.0, "peak_extra_mib": 10.0},
            {"T": 8, "case": "probe", "seconds": 1.0, "peak_extra_mib": 25.0}]
    lines = bench.table(rows).splitlines()
    assert lines[1].split()[-4:] == ["2.000", "1.00", "10.0", "1.00"]
    assert lines[2].split()[-4:] == ["1.000", "0.50", "25.0", "2.50"]


def test_a_smoke_run_prints_every_case_at_each_length(bench, capsys):
    rows = bench.main(["--lengths", "16", "32", "--heads", "2", "--repeat", "1", "--dense-up-to", "16"])
    out = capsys.readouterr().out
    assert "default budget 256 MiB" in out and ("avx512_bf16" in out or "no avx512_bf16" in out)
    cases = [(r["T"], r["case"]) for r in rows]
    each = ["train step", "probe", "probe, sampled", "call: replay 256", "call: fused 256", "qk-clip S_max"]
    assert cases == [(16, c) for c in each] + [(16, "materialised")] + [(32, c) for c in each]
    assert all(r["seconds"] > 0 and r["peak_extra_mib"] >= 0 for r in rows)
