"""Training throughput: attnscale's preset path against nanoGPT's own train.py, side by side.

nanoGPT (karpathy/nanoGPT) is taken from a local checkout given on the command
line; nothing is downloaded. Its ``train.py`` runs unchanged, with its CPU
defaults (fp32, no torch.compile, no dropout, no biases, foreach AdamW), on
character-level Tiny Shakespeare prepared exactly as its
``data/shakespeare_char/prepare.py`` does (first 90% trains, vocab 65). The
shape: 2 layers, 4 heads, T 64, batch 32, gradient accumulation 1.

attnscale runs ``runs.trainer.train_run`` with the default preset's model and budget
choices (post-LN, explicit attention, dtype "auto", recording diagnostics every
10 steps, metrics written to a run folder) at the same shape, on the same text.

``--baseline DIR`` adds a third contender: the same preset path from another
attnscale source tree (say ``mkdir /tmp/old && git archive HEAD~3 src | tar -x -C
/tmp/old``, then ``--baseline /tmp/old/src``), in the same alternating rounds, so an old and a
new version are compared under the same load.

Each measurement is a fresh subprocess with ``OMP_NUM_THREADS`` set to the
thread count; rounds alternate nanoGPT and attnscale so contention from other
processes hits both alike. Tokens/s are counted over the steps after the first
``--skip`` (nanoGPT's first iteration also evaluates; the first steps of both
build kernels), from nanoGPT's own per-iteration timings and from attnscale's
per-step callback. The ratio is of the medians over rounds.

    python benchmarks/vs_nanogpt.py /path/to/nanoGPT --corpus /path/to/tinyshakespeare/input.txt \\
        [--widths 128 256] [--threads 1 2] [--rounds 5] [--steps 60]

On a CUDA machine, ``--gpu`` runs the GPU comparison instead: nanoGPT with its
GPU defaults (bf16 autocast, torch.compile) against attnscale on ``--device
cuda`` at d_model 512, 6 layers, 8 heads, T 256, batch 64.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


# ---- nanoGPT, its own train.py in a prepared folder ---------------------------


def prepare_nanogpt(nanogpt: Path, text_path: Path, work: Path) -> Path:
    """A folder nanoGPT's train.py can run in: its configurator and data/shakespeare_char/{train,val}.bin, meta.pkl."""
    import numpy as np

    data = text_path.read_text(encoding="utf-8")
    chars = sorted(set(data))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(data)
    folder = work / "data" / "shakespeare_char"
    folder.mkdir(parents=True, exist_ok=True)
    np.array([stoi[c] for c in data[: int(n * 0.9)]], dtype=np.uint16).tofile(folder / "train.bin")
    np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    shutil.copy(nanogpt / "configurator.py", work / "configurator.py")  # train.py exec's it from the cwd
    return work


def run_nanogpt(nanogpt: Path, work: Path, shape: dict, steps: int, skip: int, threads: int, gpu: bool,
                extra: list[str] = ()) -> float:
    args = [
        f"--n_layer={shape['layers']}", f"--n_head={shape['heads']}", f"--n_embd={shape['d']}",
        f"--block_size={shape['T']}", f"--batch_size={shape['B']}", "--gradient_accumulation_steps=1",
        "--dataset=shakespeare_char", f"--max_iters={steps - 1}", f"--lr_decay_iters={steps}",
        "--warmup_iters=5", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
        "--always_save_checkpoint=False", f"--out_dir={work / 'out'}",
    ]
    args += ["--device=cuda"] if gpu else ["--device=cpu", "--compile=False", "--dtype=float32"]
    args += list(extra)  # e.g. --dropout=0.2, as config/train_shakespeare_char.py has it
    out = _run([sys.executable, str(nanogpt / "train.py"), *args], work, threads)
    dts = [float(ms) / 1000 for ms in re.findall(r"^iter \d+: loss [^,]+, time ([0-9.]+)ms", out, re.M)]
    if len(dts) != steps:
        raise RuntimeError(f"nanoGPT printed {len(dts)} iterations, expected {steps}:\n{out[-2000:]}")
    return (steps - skip) * shape["B"] * shape["T"] / sum(dts[skip:])


# ---- attnscale, the preset path -----------------------------------------------


def attnscale_worker(spec: dict) -> None:
    """Runs in the subprocess: train once, print tokens/s over the steps after ``skip``."""
    from dataclasses import replace

    import torch

    from attnscale.lm.data import load_corpus
    from attnscale.lm.model import ModelConfig
    from attnscale.lm.presets import budget
    from attnscale.runs.trainer import train_run

    corpus = load_corpus(spec["corpus"], "char", cache_dir=Path(spec["work"]) / "cache")
    preset = budget("default", corpus.vocab_size)  # what `attnscale sweep` trains
    shape = spec["shape"]
    model_kw = {**preset.model, "context": shape["T"], "d_model": shape["d"], "n_layers": shape["layers"],
                "n_heads": shape["heads"]}
    mcfg = ModelConfig(vocab_size=corpus.vocab_size, head_dim=None, scale="inv_sqrt_d", **model_kw)
    cfg = replace(preset.train, steps=spec["steps"], batch=shape["B"], warmup=5, record_every=10, eval_batches=1,
                  checkpoint_every=0, device=spec["device"], dtype=spec.get("dtype", "auto"),
                  # only where asked: an older source tree (--baseline) has no such setting
                  **({"weights": spec["weights"]} if spec.get("weights", "fp32") != "fp32" else {}))
    stamps: dict[int, float] = {}

    def stamp(step: int, steps: int, info: dict) -> None:
        if cfg.device.startswith("cuda"):
            torch.cuda.synchronize()  # the step's read-back already waits; this keeps the stamp honest if it moves
        stamps[step] = time.perf_counter()

    res = train_run(mcfg, cfg, corpus, Path(spec["work"]) / "run", on_step=stamp).results
    skip, steps = spec["skip"], spec["steps"]
    tokens = (steps - skip) * shape["B"] * shape["T"]
    print(json.dumps({"tokens_per_s": tokens / (stamps[steps] - stamps[skip]), "dtype": res.dtype,
                      "threads": res.threads, "device": res.device["name"]}))


def run_attnscale(corpus: Path, work: Path, shape: dict, steps: int, skip: int, threads: int, gpu: bool,
                  extra: list[str] = (), src: Path = SRC, dtype: str = "auto", weights: str = "fp32") -> float:
    """Tokens/s of the preset path, with attnscale imported from ``src``, training in ``dtype`` on ``weights``."""
    spec = {"corpus": str(corpus), "work": str(work), "shape": shape, "steps": steps, "skip": skip,
            "device": "cuda" if gpu else "cpu", "dtype": dtype, "weights": weights}
    out = _run([sys.executable, __file__, "--worker", json.dumps(spec)], work, threads, src)
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def _run(cmd: list[str], cwd: Path, threads: int, src: Path = SRC) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def _precision_line(dtype: str) -> str:
    """Which precision attnscale trains in here, and whether this CPU has native bf16 (nanoGPT: fp32)."""
    import torch

    from attnscale.core.device import native_bf16, resolve_precision

    name = resolve_precision(dtype, torch.device("cpu")).name
    return (f"attnscale trains in {name} (--dtype {dtype}), nanoGPT in fp32; this CPU "
            f"{'has' if native_bf16() else 'lacks'} native bf16 (avx512_bf16 or amx_bf16)")


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nanogpt", type=Path, nargs="?", help="a checkout of karpathy/nanoGPT")
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt",
                    help="Tiny Shakespeare's input.txt")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60, help="training steps per measurement (a multiple of 10)")
    ap.add_argument("--skip", type=int, default=10, help="steps left out of the timing at the start")
    ap.add_argument("--gpu", action="store_true", help="the GPU comparison (bf16, compile; d 512, 6 layers, 8 heads, T 256, batch 64)")
    ap.add_argument("--nanogpt-args", nargs="*", default=[], metavar="ARG",
                    help="more options for nanoGPT's train.py, e.g. --nanogpt-args=--dropout=0.2")
    ap.add_argument("--baseline", type=Path, metavar="SRC",
                    help="another attnscale source tree (its src/ folder) to run beside this one, e.g. the old code")
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                    help="attnscale's precision (default: the preset's auto, bf16 where the CPU has it natively)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return attnscale_worker(json.loads(args.worker))
    if args.nanogpt is None or not (args.nanogpt / "train.py").is_file():
        ap.error("give the path of a nanoGPT checkout (the folder holding train.py and model.py)")
    if not 0 <= args.skip < args.steps:
        ap.error(f"--skip {args.skip} must be at least 0 and below --steps {args.steps}")
    if not args.corpus.is_file():
        ap.error(f"--corpus {args.corpus} is not a file; give Tiny Shakespeare's input.txt")
    if args.baseline is not None and not (args.baseline / "attnscale" / "__init__.py").is_file():
        ap.error(f"--baseline {args.baseline} holds no attnscale package; give the src/ folder of a checkout")
    if args.gpu:
        shapes = [dict(d=512, layers=6, heads=8, T=256, B=64)]
        threads_list = [args.threads[0]]
    else:
        shapes = [dict(d=d, layers=2, heads=4, T=64, B=32) for d in args.widths]
        threads_list = args.threads
    work = Path(tempfile.mkdtemp(prefix="vs-nanogpt-"))
    try:
        prepare_nanogpt(args.nanogpt.resolve(), args.corpus.resolve(), work)
        print(f"nanoGPT {args.nanogpt} {' '.join(args.nanogpt_args)}, {'GPU' if args.gpu else 'CPU'}; {args.steps} steps a measurement, first "
              f"{args.skip} not timed; {args.rounds} alternating rounds; load before: {load_average()}")
        if not args.gpu:
            print(_precision_line(args.dtype))
        old = args.baseline is not None
        print(f"{'d_model':>7} {'threads':>7} {'nanoGPT tok/s':>14} {'attnscale tok/s':>16} {'ratio':>6}  "
              + (f"{'baseline tok/s':>14} {'ratio':>6} {'new/base':>8}  " if old else "") + "load (1/5/15 min)")
        contenders = {"nanogpt": lambda *a: run_nanogpt(args.nanogpt.resolve(), *a),
                      "attnscale": lambda *a: run_attnscale(args.corpus.resolve(), *a, dtype=args.dtype)}
        if old:
            contenders["baseline"] = lambda *a: run_attnscale(args.corpus.resolve(), *a, src=args.baseline.resolve(),
                                                              dtype=args.dtype)
        for shape in shapes:
            for threads in threads_list:
                rates = {who: [] for who in contenders}
                for r in range(args.rounds):
                    order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
                    for who in order:
                        rates[who].append(contenders[who](work, shape, args.steps, args.skip, threads, args.gpu,
                                                          args.nanogpt_args))
                med = {who: statistics.median(v) for who, v in rates.items()}
                ng, at = med["nanogpt"], med["attnscale"]
                extra = (f"{med['baseline']:14.0f} {med['baseline'] / ng:5.2f}x {at / med['baseline']:7.2f}x  "
                         if old else "")
                print(f"{shape['d']:7d} {threads:7d} {ng:14.0f} {at:16.0f} {at / ng:5.2f}x  {extra}{load_average()}", flush=True)
                print("        rounds: " + ", ".join(f"{who} {[round(t) for t in v]}" for who, v in rates.items()),
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
