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

import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from benchmark_scripts import run_bench

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
REAL_NANOGPT = Path(os.environ.get("NANOGPT_DIR", "/work/nanoGPT"))
STEP_MS = 100.0  # the stand-in nanoGPT's time per iteration


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


def _says(out: str, dtype: str) -> None:
    from attnscale.core.device import native_bf16

    cpu = "has" if native_bf16() else "lacks"
    assert f"attnscale trains in {dtype} (--dtype {dtype}), nanoGPT in fp32; this CPU {cpu} native bf16" in out


@pytest.mark.parametrize("which", nanogpt_dirs())
def test_vs_nanogpt(which, stand_in_nanogpt, text_file):
    nanogpt = which or stand_in_nanogpt
    out = run_bench("vs_nanogpt.py", str(nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads", "1",
                    "--rounds", "1", "--steps", "6", "--skip", "2", "--dtype", "fp32")
    row = re.search(r"^\s+16\s+1\s+(\d+)\s+(\d+)\s+([0-9.]+)x", out, re.M)
    assert row, out
    ng, at, ratio = int(row[1]), int(row[2]), float(row[3])
    assert at > 0 and ratio == pytest.approx(at / ng, abs=0.01)
    _says(out, "fp32")
    if which is None:  # batch 32 × T 64 tokens a step, each step STEP_MS
        assert ng == round(32 * 64 / (STEP_MS / 1000))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_worker_trains_in_the_precision_asked_for(dtype, text_file, tmp_path):
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


def test_vs_nanogpt_in_bf16_beside_a_baseline_tree(stand_in_nanogpt, text_file):
    """One run for two things: the bf16 path says what it trains in, and a baseline tree gets its own columns."""
    src = Path(__file__).resolve().parent.parent / "src"  # this tree as its own baseline: the plumbing, not a speed
    out = run_bench("vs_nanogpt.py", str(stand_in_nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads",
                    "1", "--rounds", "1", "--steps", "6", "--skip", "2", "--baseline", str(src), "--dtype", "bf16")
    _says(out, "bf16")
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
                    "--rounds", "1", "--steps", "10", "--table", "40")
    ms = dict(re.findall(r"^\s+(attnscale|nanoGPT)\s+([0-9.]+)", out, re.M))
    ratio = float(re.search(r"nanoGPT / attnscale = ([0-9.]+)", out)[1])
    assert ratio == pytest.approx(float(ms["nanoGPT"]) / float(ms["attnscale"]), abs=0.02)
    assert "attnscale, 10 steps:" in out and "nanoGPT, 10 steps:" in out
    # the copies line says what the profile's own table says of copy_ (sorted by self time, it lists it at d 16)
    table = out[out.index("attnscale, 10 steps:"):out.index("nanoGPT, 10 steps:")]
    calls = int(re.search(r"aten::copy_ (\d+) calls", table)[1])
    row = re.search(r"^\s+aten::copy_\s.*?(\d+)\s*$", table, re.M)
    assert row is None or int(row[1]) == calls
    assert calls > 0 and "aten::_to_copy" in re.search(r"copies and casts: .*", table)[0]


def _step_limit(out: str, text_file: Path, contenders: list[str]) -> None:
    """Every figure of a step_limit.py table from the others it prints, and the FLOPs counted by hand."""
    flops = int(re.search(r"products, (\d+) FLOP a step", out)[1])
    # by hand: 6 FLOP per weight per token for every linear layer (forward, then the gradients of its input
    # and of its weight), and 3 × the two attention products of the forward (2·B·H·T·T·d_k FLOP each)
    from attnscale.lm.data import load_corpus

    vocab = load_corpus(str(text_file), "char", cache_dir=text_file.parent / "cache").vocab_size
    d, layers, heads, T, B = 16, 2, 4, 64, 32
    weights = layers * (4 * d * d + 2 * 4 * d * d) + d * vocab
    assert flops == 6 * B * T * weights + layers * 3 * 2 * (2 * B * heads * T * T * (d // heads))
    head = re.search(r"^\s+16\s+1\s+([0-9.]+)\s+([0-9.]+)ms\s+([0-9.]+) \|", out, re.M)
    assert float(head[1]) == pytest.approx(flops / 1e9, abs=6e-4)
    alone_ms = float(head[2])
    assert float(head[3]) == pytest.approx(flops / alone_ms / 1e6, rel=0.02, abs=0.15)  # GFLOP/s of the GEMMs alone
    rows = re.findall(r"\| (fp32|bf16)(, \w+)?\s+([0-9.]+)\s+(\d+)%\s+([0-9.]+)ms \(([0-9.]+)x\)", out)
    assert [r[0] + r[1] for r in rows] == contenders
    for *_, ms, share, rec, ratio in rows:
        assert int(share) == pytest.approx(100 * alone_ms / float(ms), abs=1 + 100 * 0.05 / float(ms))
        assert float(ratio) == pytest.approx(float(rec) / float(ms), abs=0.01 + 0.1 / float(ms))
    assert "CPU features:" in out


def test_step_limit_states_the_share_of_the_gemm_limit(text_file):
    out = run_bench("step_limit.py", "--corpus", str(text_file), "--widths", "16", "--threads", "1", "--rounds", "1",
                    "--dtype", "fp32")
    _step_limit(out, text_file, ["fp32"])


# the nanoGPT runs are vs_nanogpt.py's, which test_vs_nanogpt covers; a compile takes seconds even at d 16
@pytest.mark.slow
def test_step_limit_times_a_compiled_forward_apart_beside_nanogpt(stand_in_nanogpt, text_file):
    out = run_bench("step_limit.py", str(stand_in_nanogpt), "--corpus", str(text_file), "--widths", "16", "--threads",
                    "1", "--rounds", "1", "--dtype", "bf16", "--weights", "fp32", "bf16", "--compile", "--attention",
                    "explicit", "fused", "--nanogpt-rounds", "1", "--nanogpt-steps", "12")
    _step_limit(out, text_file, ["fp32, explicit", "fp32, fused", "bf16, explicit", "bf16, fused", "fp32, compiled"])
    assert float(re.search(r"compiling took ([0-9.]+) s", out)[1]) > 0
    line = re.search(r"tokens/s: nanoGPT \(fp32\) (\d+); attnscale fp32 (\d+) \(([0-9.]+)x\); "
                     r"attnscale bf16 (\d+) \(([0-9.]+)x\)", out)
    assert line, out
    assert float(line[3]) == pytest.approx(int(line[2]) / int(line[1]), abs=0.006)
    assert float(line[5]) == pytest.approx(int(line[4]) / int(line[1]), abs=0.006)


def test_step_limit_refuses_bf16_weights_on_an_fp32_step(text_file):
    proc = subprocess.run([sys.executable, str(BENCH / "step_limit.py"), "--corpus", str(text_file), "--dtype", "fp32",
                           "--weights", "bf16"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--weights bf16 needs a bf16 step" in proc.stderr and "Traceback" not in proc.stderr
