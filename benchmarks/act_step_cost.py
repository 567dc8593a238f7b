"""What each arm of the act study costs a training step, relative to arm A, side by side in one process.

The act study's arms (docs/act-study.md) on its own recipe and loop (``lm.train.train``, with the watch each arm
takes, built from the same plain data the study's runs carry: ``experiments.act_study.watch_spec``): A nothing;
B QK-Clip at tau 100 from step 0; C the alarm's QK-Clip, on from the first probe (the level set at 1, so the
alarm fires at step 10 and the clip is on for the rest of the round, as in a run after its alarm); D the rate
halved from the same alarm; E qk-norm. Each round trains every arm ``--steps`` steps from the same seed, the
arms in an order rotated by one each round, and times the process's CPU time (``time.process_time``: neighbours
on shared cores disturb it far less than wall time) of the whole call (the steps, and the model's build and one
held-out batch, the same for every arm), divided by the steps. Printed: per arm the median CPU time a
step, and its ratio to A's: the mean over rounds of the round's ratio, with a two-sided 95% t interval at
rounds − 1 degrees of freedom.

    python benchmarks/act_step_cost.py                     # 5 rounds of 200 steps of the study's model, 1 thread
    python benchmarks/act_step_cost.py --rounds 3 --steps 50 --width 16   # smaller
    python benchmarks/act_step_cost.py --arms A B C E --optimizer muon    # the lr study's Muon runs
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from attnscale.analysis.intervals import interval
from attnscale.experiments import act_study as act
from attnscale.experiments import warn_study as ws
from attnscale.lm.data import load_corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import train
from attnscale.runs.trainer import build_watch

ALARM = 1.0  # the alarm's level here: under any head's max |score| after 10 steps, so C's and D's actions are on


def one_arm(arm: str, args, corpus) -> float:
    """CPU seconds a step of ``arm`` over ``args.steps`` steps of a fresh run (cell z0, seed 0)."""
    model = ModelConfig(vocab_size=corpus.vocab_size, head_dim=args.width, scale="qk_norm" if arm == "E" else "inv_sqrt_d",
                        **{**ws.PilotConfig().model, "d_model": args.width, "norm": "pre"})
    cfg = replace(ws.recipe_train(steps=args.steps, warmup=min(10, args.steps - 1)), lr=act.LR, batch=args.batch,
                  checkpoint_every=0, eval_batches=1)
    if args.optimizer != "adamw":  # as the lr study's Muon runs: Muon for the blocks' matrices, AdamW beside it
        cfg = replace(cfg, optimizer=args.optimizer)
    watch = build_watch(act.watch_spec(arm, ALARM, cfg.record_every))
    start = time.process_time()
    results = train(model, cfg, corpus, watch=watch) if watch is not None else train(model, cfg, corpus)
    spent = time.process_time() - start
    if arm in ("C", "D") and not results["actions"]:
        raise RuntimeError(f"arm {arm}: the alarm did not fire, so its action was never on")
    return spent / args.steps


def ratio_summary(ratios: list[float]) -> dict:
    """The mean of the rounds' ratios with its two-sided 95% t interval (None for one round)."""
    n = len(ratios)
    mean = statistics.fmean(ratios)
    se = statistics.stdev(ratios) / n ** 0.5 if n >= 2 else None
    return {"mean": mean, "se": se, "n": n, "interval": interval(mean, se, n)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", choices=act.ARMS, default=list(act.ARMS))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--width", type=int, default=64, help="d_model and head width (the study's: 64)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                   help="the runs' optimizer: the act study's AdamW, or the lr study's Muon (docs/lr-study.md)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--flush-denormal", action="store_true",
                   help="flush subnormal floats to zero (torch.set_flush_denormal): the arms' weights drift apart after "
                        "the alarm, and a run whose numbers turn subnormal computes slower on a CPU whatever its action")
    args = p.parse_args(argv)
    if "A" not in args.arms:
        p.error("--arms must include A, the baseline every ratio is taken against")
    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        p.error("--flush-denormal: this CPU cannot flush subnormal floats (no SSE3)")
    try:
        return _measure(args)
    finally:
        if args.flush_denormal:
            torch.set_flush_denormal(False)  # the process's arithmetic as it was (a caller's tests run on after)


def _measure(args) -> int:
    corpus = load_corpus("default")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.rounds} rounds of {args.steps} steps "
          f"an arm, width {args.width}, batch {args.batch}, {args.optimizer}; CPU time a step"
          + ("; subnormal floats flushed to zero" if args.flush_denormal else ""))
    for arm in args.arms:
        one_arm(arm, argparse.Namespace(**{**vars(args), "steps": min(args.steps, 20)}), corpus)  # warm-up: first calls
    times: dict[str, list[float]] = {a: [] for a in args.arms}
    for r in range(args.rounds):
        k = r % len(args.arms)
        for arm in args.arms[k:] + args.arms[:k]:
            times[arm].append(one_arm(arm, args, corpus))
        print(f"round {r + 1}: " + ", ".join(f"{a} {1e3 * times[a][-1]:.2f} ms" for a in args.arms))
    for arm in args.arms:
        if arm == "A":
            print(f"A: median {1e3 * statistics.median(times[arm]):.2f} ms a step (the baseline)")
            continue
        s = ratio_summary([t / a for t, a in zip(times[arm], times["A"])])
        ci = "" if s["interval"] is None else f" [{s['interval'][0]:.3f}, {s['interval'][1]:.3f}]"
        print(f"{arm}: median {1e3 * statistics.median(times[arm]):.2f} ms a step, ratio to A {s['mean']:.3f}{ci}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
