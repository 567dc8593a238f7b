"""Achieved FLOP/s of a training step, against this machine's own GEMM rate on the same shapes.

The step is attnscale's preset step at vs_nanogpt.py's shape (2 layers, 4 heads,
T 64, batch 32, Tiny Shakespeare's 65 characters), recording every 10th step
as training does, in each attention path of the steps that do not record.

Its arithmetic is counted, not assumed: a dispatch mode catches every matrix
product one step runs (mm, addmm, bmm; forward and backward; the explicit path,
whose attention is two products), with its operands as they were, layout and
all; the step's FLOPs are the sum of 2·m·n·k over them. The GEMM rate is those
same products, on copies of the same operands, run alone back to back here with
the same thread count: what the step's arithmetic would take if nothing else
cost anything. The fused path does the same useful work (its causal kernel may
skip the masked half of the scores, so its figure counts work it need not do).

Times: blocks of 10 steps (one of them recording), alternating the paths and the
GEMM replay, median over rounds; CPU time of the process at one thread (other
processes on the machine change it less), wall time at more.

    python benchmarks/step_flops.py --corpus .../tinyshakespeare/input.txt [--widths 128 256] [--threads 1 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_profile import attnscale_step  # noqa: E402  (the preset's step, as step_profile.py times it)
from vs_nanogpt import _load  # noqa: E402

from attnscale.lm.data import load_corpus  # noqa: E402

GEMMS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2)}  # op -> positions of its two factors


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


def caught(step) -> CatchGemms:
    """The matrix products of one explicit-path, non-recording step."""
    with CatchGemms() as catch:
        step()
    return catch


def replay(calls) -> None:
    for func, args, kwargs, _ in calls:
        func(*args, **kwargs)


def clock(threads: int):
    return time.process_time if threads == 1 else time.perf_counter


def per_step_s(fn, n: int, threads: int) -> float:
    now = clock(threads)
    t = now()
    for _ in range(n):
        fn()
    return (now() - t) / n


def measure(corpus, d: int, threads: int, rounds: int) -> dict:
    torch.set_num_threads(threads)
    steps = {impl: attnscale_step(corpus, d, impl) for impl in ("explicit", "fused")}
    probe = attnscale_step(corpus, d, "explicit")  # its first step does not record
    gemms = caught(probe).calls
    flops = sum(c[3] for c in gemms)
    work = {**steps, "GEMMs alone": lambda: replay(gemms)}
    for fn in work.values():
        per_step_s(fn, 10, threads)  # warm-up: allocator, kernel choice
    times = {k: [] for k in work}
    for r in range(rounds):
        for k in (list(work) if r % 2 == 0 else list(work)[::-1]):
            times[k].append(per_step_s(work[k], 10, threads))
    return {"flops": flops, "products": len(gemms), **{k: statistics.median(v) for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not args.corpus.is_file():
        ap.error(f"--corpus {args.corpus} is not a file; give Tiny Shakespeare's input.txt")
    with tempfile.TemporaryDirectory() as work:
        corpus = load_corpus(str(args.corpus), "char", cache_dir=Path(work) / "cache")
        print(f"torch {torch.__version__}; blocks of 10 steps, median of {args.rounds} alternating rounds; "
              f"load before: {_load()}")
        print(f"{'d_model':>7} {'threads':>7} {'GFLOP/step':>10} {'GEMM GFLOP/s':>12} | "
              f"{'path':<8} {'ms/step':>8} {'GFLOP/s':>8} {'of GEMM':>7}")
        for d in args.widths:
            for threads in args.threads:
                m = measure(corpus, d, threads, args.rounds)
                gemm_rate = m["flops"] / m["GEMMs alone"]
                for i, impl in enumerate(("explicit", "fused")):
                    rate = m["flops"] / m[impl]
                    head = (f"{d:7d} {threads:7d} {m['flops'] / 1e9:10.3f} {gemm_rate / 1e9:12.1f}" if i == 0
                            else " " * 39)
                    print(f"{head} | {impl:<8} {1e3 * m[impl]:8.1f} {rate / 1e9:8.1f} {rate / gemm_rate:6.0%}")
                print(f"{'':39} | ({m['products']} products, {m['flops']} FLOP a step; GEMMs alone "
                      f"{1e3 * m['GEMMs alone']:.1f} ms; "
                      f"load {_load()})", flush=True)


if __name__ == "__main__":
    main()
