"""`reproduce`'s training stages, step by step: the old attention path against the new, side by side.

Training in fp32 on the CPU used to take the explicit attention path on every
step; it now takes fused SDPA on the steps that do not record (``lm.train``).
Timing a whole ``reproduce`` both ways takes tens of minutes and, on a shared
machine, says more about the load than the code. This times what changed
instead: for every distinct run of each training stage (its width and scheme;
the seeds and learning rates of one width and scheme cost the same), blocks of
10 steps (one of them recording, as in training) with ``attention="explicit"``
(the old path) and ``"auto"`` (the new), alternating, median of the rounds, in
CPU time at one thread (``reproduce -j 2`` on 2 cores trains each run on one).
Each stage's training time is then its runs' steps × their step times; the
ratio old / new is what the change saves that stage. Evaluation, the final
recording and the files are left out (evaluation also runs fused now).

    python benchmarks/reproduce_stages.py [--preset default] [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from attnscale.lm.data import load_corpus
from attnscale.lm.train import train
from attnscale.reproduce import stages

from vs_nanogpt import load_average

PATHS = {"old": "explicit", "new": "auto"}


def step_cpu_s(spec, corpus, attention: str, steps: int) -> float:
    """CPU seconds a step of ``spec`` takes on one thread: ``steps`` steps after a first, untimed one."""
    stamps: list[float] = []
    train(spec.model, replace(spec.train, threads=1, checkpoint_every=0, eval_batches=1, attention=attention), corpus,
          on_step=lambda step, total, info: stamps.append(time.process_time()),
          should_stop=lambda: len(stamps) >= steps + 1)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default", choices=["quick", "default", "full"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps a measurement (10: one recording step)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus("default")
    training = [st for st in stages(preset=args.preset, jobs=2) if st.group and st.runs]
    print(f"torch {torch.__version__}, 1 thread, CPU time; {args.steps} steps a measurement after one untimed, "
          f"{args.rounds} alternating rounds; load before: {load_average()}")
    print(f"{'stage':<52} {'runs':>4} {'steps':>6} {'shape':>22} {'old ms':>8} {'new ms':>8} {'old/new':>7}")
    for st in training:
        shapes: dict[tuple, list] = {}
        for s in st.runs:
            shapes.setdefault((s.model.head_dim, s.model.scale), []).append(s)
        totals = {"old": 0.0, "new": 0.0}
        for (width, scale), runs in shapes.items():
            times = {k: [] for k in PATHS}
            for r in range(args.rounds):
                for k in (list(PATHS) if r % 2 == 0 else list(PATHS)[::-1]):
                    times[k].append(step_cpu_s(runs[0], corpus, PATHS[k], args.steps))
            med = {k: statistics.median(v) for k, v in times.items()}
            steps = sum(s.train.steps for s in runs)
            for k in PATHS:
                totals[k] += med[k] * steps
            print(f"{'':<52} {len(runs):4d} {steps:6d} {f'd_k {width} {scale}':>22} {1e3 * med['old']:8.1f} "
                  f"{1e3 * med['new']:8.1f} {med['old'] / med['new']:6.2f}x", flush=True)
        print(f"{st.name[:52]:<52} {len(st.runs):4d} {'':>6} {'training, s':>22} {totals['old']:8.1f} {totals['new']:8.1f} "
              f"{totals['old'] / totals['new']:6.2f}x   load {load_average()}", flush=True)


if __name__ == "__main__":
    main()
