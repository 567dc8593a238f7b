"""Cost of recording the diagnostics: step time with recording every 10 steps vs none.

Two measurements, both side by side in one process, one thread, in CPU time
(``time.process_time``), which other processes sharing the cores disturb far
less than wall time:

1. Within one run: each step's time from the ``on_step`` timestamps; the
   extra time of a recorded step over the median plain step, divided by 10
   plain steps, is the overhead at ``record_every=10``.
2. Whole runs, alternating A (record_every=10) and B (no recording after
   step 0), medians of the summed step times.

Target: at most 5% at record_every=10.

    .venv/bin/python benchmarks/record_overhead.py [--widths 32 1024] [--steps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnscale.lm.data import load_corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.presets import budget
from attnscale.lm.train import TrainConfig, train


def step_times(mcfg: ModelConfig, cfg: TrainConfig, corpus) -> list[float]:
    stamps = [time.process_time()]
    train(mcfg, cfg, corpus, on_step=lambda *a: stamps.append(time.process_time()))
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus("default")
    model_kw, base = budget(args.preset).model, budget(args.preset).train
    print(f"torch {torch.__version__}, 1 thread, preset {args.preset!r} model {model_kw}, batch {base.batch}, "
          f"dtype {base.dtype}, {args.steps} steps")
    for width in args.widths:
        mcfg = ModelConfig(vocab_size=corpus.vocab_size, head_dim=width, scale="none", **model_kw)
        cfg = TrainConfig(**{**base.__dict__, "steps": args.steps, "warmup": 5, "record_every": 10,
                             "eval_batches": 1, "threads": 1})
        off = TrainConfig(**{**cfg.__dict__, "record_every": 10**9})
        step_times(mcfg, cfg, corpus)  # warm-up

        # 1. recorded vs plain steps of the same run (step 0 left out: first-call costs)
        ts = step_times(mcfg, cfg, corpus)
        recorded = [t for i, t in enumerate(ts) if i % 10 == 0 and i > 0]
        plain = [t for i, t in enumerate(ts) if i % 10 != 0]
        extra = statistics.median(recorded) - statistics.median(plain)
        per_step = extra / (10 * statistics.median(plain))

        # 2. whole runs, alternating
        on_s, off_s = [], []
        for _ in range(args.rounds):
            on_s.append(sum(step_times(mcfg, cfg, corpus)[1:]))  # step 0 records in both
            off_s.append(sum(step_times(mcfg, off, corpus)[1:]))
        whole = statistics.median(on_s) / statistics.median(off_s) - 1
        print(f"d_k={width:5d}: plain step {1e3 * statistics.median(plain):6.1f} ms, recorded step "
              f"{1e3 * statistics.median(recorded):6.1f} ms -> overhead at record_every=10: {100 * per_step:+.1f}% "
              f"(within-run), {100 * whole:+.1f}% (whole runs, median of {args.rounds})")


if __name__ == "__main__":
    main()
