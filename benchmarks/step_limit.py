"""The training step against this CPU's GEMM limit: the share of it a step reaches, beside nanoGPT.

In one run, for each d_model and thread count, at vs_nanogpt.py's shape (2 layers, 4 heads, T 64,
batch 32, Tiny Shakespeare's characters):

- the step: ``lm.train``'s own step (``build_run``, ``train_step``: the default preset's model and optimiser,
  recording every 10th step), in the precision ``--dtype`` resolves to on this CPU, once for each
  ``--weights`` (in bf16: fp32 weights under autocast, or a bf16 copy of fp32 masters); the steps that
  record and those that do not are timed apart;
- its arithmetic: a dispatch mode catches every matrix product (mm, addmm, bmm; forward and backward)
  of one step that does not record, on the explicit attention path (whose attention is two products;
  a fused kernel does the same useful work inside), operands as they came (dtype, layout); FLOPs = the
  sum of 2·m·n·k;
- the GEMM limit: those same products, on copies of their operands, replayed alone back to back at the
  same thread count: the step's time if nothing but its matrix products cost anything;
- the share of the limit: GEMM-alone time / the time of a step that does not record;
- ``--compile``: the same step with the model's forward through ``torch.compile`` (inductor) on the steps
  that do not record, its compile time printed apart, so it is kept only where it pays;
- with a nanoGPT checkout: ``vs_nanogpt.py``'s tokens/s of nanoGPT's own train.py (fp32) and of
  attnscale's preset path (``--dtype``, each ``--weights``), fresh processes, alternating rounds.

Times: blocks of 10 steps (one of them recording), the contenders and the GEMM replay alternating,
medians over rounds; CPU time of the process at one thread (other processes change it less), wall
time at more. The CPU's features (avx512_bf16, amx_bf16, ...) are printed first: a share measured
where bf16 is emulated says nothing of a CPU that has it.

    python benchmarks/step_limit.py [/path/to/nanoGPT] --corpus .../tinyshakespeare/input.txt \\
        [--widths 128 256] [--threads 1 2] [--rounds 5] [--dtype auto] [--weights fp32 bf16] [--compile] \\
        [--attention explicit fused]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vs_nanogpt import load_average, prepare_nanogpt, run_attnscale, run_nanogpt

from attnscale.core.device import resolve_precision
from attnscale.lm import train as T
from attnscale.lm.data import load_corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.presets import budget

GEMMS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2)}  # op -> positions of its two factors
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
RECORD_EVERY = 10
SHAPE = dict(layers=2, heads=4, T=64, B=32)


def cpu_features() -> list[str]:
    """Which of ``FEATURES`` /proc/cpuinfo lists (none where it cannot be read)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [f for f in FEATURES if f in flags]


class CatchGemms(TorchDispatchMode):
    """Keeps (op, copied arguments, FLOPs) of every matrix product run inside it."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        where = GEMMS.get(func.overloadpacket.__name__)
        if where is not None:
            a, b = args[where[0]], args[where[1]]
            # (batch ×) m×k times k×n: 2·m·n·k, each product a multiply and an add
            flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
            copies = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in args]
            self.calls.append((func, copies, dict(kwargs or {}), flops))
        return out


def replay(calls) -> None:
    for func, args, kwargs, _ in calls:
        func(*args, **kwargs)


def training_step(corpus, d: int, dtype: str, weights: str, compiled: bool = False, attention: str = "auto"):
    """``step(i)``: training's own step ``i`` (recording where ``i`` is a multiple of 10) on a model built
    as the default preset builds it at this shape; with ``compiled``, the forward of the steps that do not
    record goes through torch.compile (the recording ones keep the eager forward the hooks read)."""
    preset = budget("default", corpus.vocab_size)  # what `attnscale sweep` trains
    mcfg = ModelConfig(vocab_size=corpus.vocab_size, head_dim=None, scale="inv_sqrt_d",
                       **{**preset.model, "context": SHAPE["T"], "d_model": d, "n_layers": SHAPE["layers"],
                          "n_heads": SHAPE["heads"]})
    cfg = replace(preset.train, steps=10**9, batch=SHAPE["B"], warmup=5, record_every=RECORD_EVERY, checkpoint_every=0,
                  device="cpu", dtype=dtype, weights=weights, attention=attention)
    run = T.build_run(mcfg, cfg, None)
    if compiled:
        net = run.net
        eager, fast = net.forward, torch.compile(net.forward)
        net.forward = lambda idx: (eager if any(b.attn.recording for b in net.blocks) else fast)(idx)
    return lambda i: T.train_step(run, i, corpus)


def caught(step) -> list[tuple]:
    """The matrix products of step 1 (one that does not record)."""
    with CatchGemms() as catch:
        step(1)
    return catch.calls


def _clock(threads: int):
    return time.process_time if threads == 1 else time.perf_counter


def block(step, start: int, threads: int) -> tuple[list[float], list[float]]:
    """Steps start .. start+9 (one of them records): (seconds of each plain step, of each recording one)."""
    now = _clock(threads)
    plain, recording = [], []
    for i in range(start, start + RECORD_EVERY):
        t = now()
        step(i)
        (recording if i % RECORD_EVERY == 0 else plain).append(now() - t)
    return plain, recording


def seconds(fn, threads: int) -> float:
    now = _clock(threads)
    t = now()
    fn()
    return now() - t


def measure(corpus, d: int, threads: int, rounds: int, dtype: str, weights: list[str], compiled: bool,
            attention: list[str] = ("auto",)) -> dict:
    """Per contender (each of ``weights``, on each ``attention`` path of the steps that do not record) the
    median plain and recording step; the GEMMs of a plain step, alone."""
    torch.set_num_threads(threads)
    steps = {w if a == "auto" else f"{w}, {a}": training_step(corpus, d, dtype, w, attention=a)
             for w in weights for a in attention}
    compile_s = None
    if compiled:
        w = weights[0]
        steps[f"{w}, compiled"] = training_step(corpus, d, dtype, w, compiled=True)
        compile_s = seconds(lambda: steps[f"{w}, compiled"](1), threads)  # the first call compiles
    gemms = caught(training_step(corpus, d, dtype, weights[0], attention="explicit"))
    flops = sum(c[3] for c in gemms)
    for s in steps.values():  # warm-up: allocator, kernel choice (and a compile's recompiles)
        block(s, 1, threads)
    for _ in range(2):
        replay(gemms)
    plain = {k: [] for k in steps}
    recording = {k: [] for k in steps}
    alone = []
    for r in range(rounds):
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for k in order:
            p, rec = block(steps[k], RECORD_EVERY * (r + 1), threads)
            plain[k].append(statistics.median(p))
            recording[k].append(statistics.median(rec))
        alone.append(seconds(lambda: replay(gemms), threads))
    return {"flops": flops, "products": len(gemms), "alone": statistics.median(alone), "compile_s": compile_s,
            "plain": {k: statistics.median(v) for k, v in plain.items()},
            "recording": {k: statistics.median(v) for k, v in recording.items()}}


def nanogpt_ratio(nanogpt: Path, corpus_path: Path, work: Path, d: int, threads: int, rounds: int, dtype: str,
                  weights: list[str], steps: int = 60, skip: int = 10) -> dict:
    """Tokens/s of nanoGPT's train.py and of attnscale's preset path for each ``weights``, alternating
    rounds of fresh processes (``vs_nanogpt.py``'s measurement), medians."""
    shape = dict(d=d, **SHAPE)
    who = {"nanoGPT": lambda: run_nanogpt(nanogpt, work, shape, steps, skip, threads, False)}
    for w in weights:
        who[w] = lambda w=w: run_attnscale(corpus_path, work, shape, steps, skip, threads, False, dtype=dtype, weights=w)
    rates = {k: [] for k in who}
    for r in range(rounds):
        for k in (list(who) if r % 2 == 0 else list(who)[::-1]):
            rates[k].append(who[k]())
    return {k: statistics.median(v) for k, v in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nanogpt", type=Path, nargs="?", help="a checkout of karpathy/nanoGPT: adds the tokens/s ratio")
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                    help="the step's precision (default: the preset's auto, bf16 where the CPU has it natively)")
    ap.add_argument("--weights", nargs="+", choices=["fp32", "bf16"],
                    help="what a bf16 step computes on (default: both in bf16, fp32 alone in fp32)")
    ap.add_argument("--compile", action="store_true", help="add the step with a torch.compile'd forward")
    ap.add_argument("--attention", nargs="+", choices=["auto", "explicit", "fused"], default=["auto"],
                    help="the attention path of the steps that do not record (default: training's own choice)")
    ap.add_argument("--nanogpt-rounds", type=int, default=3, help="rounds of the tokens/s comparison")
    ap.add_argument("--nanogpt-steps", type=int, default=60, help="steps a run of the tokens/s comparison, "
                    "the first 10 not timed")
    args = ap.parse_args()
    if not args.corpus.is_file():
        ap.error(f"--corpus {args.corpus} is not a file; give Tiny Shakespeare's input.txt")
    if args.nanogpt_steps <= 10:
        ap.error(f"--nanogpt-steps {args.nanogpt_steps} must be above the 10 steps left out of the timing")
    if args.nanogpt is not None and not (args.nanogpt / "train.py").is_file():
        ap.error(f"{args.nanogpt} holds no train.py; give the path of a nanoGPT checkout")
    precision = resolve_precision(args.dtype, torch.device("cpu")).name
    weights = args.weights or (["fp32", "bf16"] if precision == "bf16" else ["fp32"])
    if precision != "bf16" and weights != ["fp32"]:
        ap.error(f"--weights bf16 needs a bf16 step, and --dtype {args.dtype} trains in {precision} here; "
                 "give --dtype bf16")
    with tempfile.TemporaryDirectory() as work:
        corpus = load_corpus(str(args.corpus), "char", cache_dir=Path(work) / "cache")
        print(f"torch {torch.__version__}; CPU features: {' '.join(cpu_features()) or 'none of ' + ' '.join(FEATURES)}; "
              f"the step in {precision} (--dtype {args.dtype}); blocks of {RECORD_EVERY} steps, median of "
              f"{args.rounds} alternating rounds; load before: {load_average()}")
        print(f"{'d_model':>7} {'threads':>7} {'GFLOP/step':>10} {'GEMM limit':>10} {'GFLOP/s':>8} | "
              f"{'weights':<15} {'ms/step':>8} {'of limit':>8} {'recording':>10}")
        if args.nanogpt is not None:
            prepare_nanogpt(args.nanogpt.resolve(), args.corpus.resolve(), Path(work))
        for d in args.widths:
            for threads in args.threads:
                m = measure(corpus, d, threads, args.rounds, args.dtype, weights, args.compile, args.attention)
                for i, k in enumerate(m["plain"]):
                    plain, rec = m["plain"][k], m["recording"][k]
                    head = (f"{d:7d} {threads:7d} {m['flops'] / 1e9:10.3f} {1e3 * m['alone']:8.1f}ms "
                            f"{m['flops'] / m['alone'] / 1e9:8.1f}" if i == 0 else " " * 46)
                    print(f"{head} | {k:<15} {1e3 * plain:8.1f} {m['alone'] / plain:8.0%} {1e3 * rec:8.1f}ms "
                          f"({rec / plain:.2f}x)")
                print(f"{'':46} | ({m['products']} products, {m['flops']} FLOP a step"
                      + (f"; compiling took {m['compile_s']:.1f} s" if m["compile_s"] is not None else "")
                      + f"; load {load_average()})", flush=True)
                if args.nanogpt is not None:
                    rates = nanogpt_ratio(args.nanogpt.resolve(), args.corpus.resolve(), Path(work), d, threads,
                                          args.nanogpt_rounds, args.dtype, weights, args.nanogpt_steps)
                    ng = rates.pop("nanoGPT")
                    print(f"{'':46} | tokens/s: nanoGPT (fp32) {ng:.0f}; "
                          + "; ".join(f"attnscale {k} {v:.0f} ({v / ng:.2f}x)" for k, v in rates.items())
                          + f"; load {load_average()}", flush=True)


if __name__ == "__main__":
    main()
