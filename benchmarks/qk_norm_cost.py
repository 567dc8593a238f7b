"""What qk-norm costs a training step of the act study's model: its RMS norm written out op by op (QKNorm on
the CPU), as ``F.rms_norm`` (QKNorm on CUDA), or with a backward written by hand, side by side in one process,
with and without subnormal floats flushed to zero.

Four variants of the act study's model and loop (``benchmarks/act_step_cost.py``'s arm A, its recipe, no
watch): "off", its 1/sqrt(d) without qk-norm (arm A); with qk-norm, "ops": ``x · rsqrt(mean(x²) + eps) · gain``
written out, autograd differentiating each op (``QKNorm`` as it is on the CPU); "F.rms_norm": torch's (on the
CPU, torch 2.13, the same ops, values and gradients, in another layout); "hand": the same forward as one
``torch.autograd.Function`` keeping x̂ = x·r and r, whose backward is written out, dgain = Σ dy·x̂ and
dx = r·(dy·gain − x̂·mean(dy·gain·x̂)), fewer passes over q and k than autograd's (tried, not kept). Each round
trains every variant ``--steps`` steps from the same seed under each flush setting, both orders rotated by one
each round, and times the process's CPU time of the whole call divided by the steps. Printed per flush setting:
each variant's median CPU time a step, and the ratios of each qk-norm variant to "off" and of "F.rms_norm" and
"hand" to "ops": the mean over rounds of the round's ratio, with a two-sided 95% t interval at rounds − 1
degrees of freedom.

    python benchmarks/qk_norm_cost.py                      # 5 rounds of 200 steps of the study's model, 1 thread
    python benchmarks/qk_norm_cost.py --rounds 2 --steps 12 --width 16 --batch 2   # smoke size
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from act_step_cost import ratio_summary
from probe_cost import cpu_features

from attnscale.core.scales import QKNorm
from attnscale.experiments import act_study as act
from attnscale.experiments import warn_study as ws
from attnscale.lm.data import load_corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import train

VARIANTS = ("off", "ops", "F.rms_norm", "hand")
RATIOS = (("ops", "off"), ("F.rms_norm", "off"), ("hand", "off"), ("F.rms_norm", "ops"), ("hand", "ops"))
FLUSH = (True, False)


def _torch_rms_norm(self, q_BHTD, k_BHTD):
    """QKNorm.prepare by ``F.rms_norm`` (q, k and the gains of one dtype here: the act study trains in fp32)."""
    return (F.rms_norm(q_BHTD, (q_BHTD.shape[-1],), self.q_gain, self.eps),
            F.rms_norm(k_BHTD, (k_BHTD.shape[-1],), self.k_gain, self.eps))


class HandBackward(torch.autograd.Function):
    """x · rsqrt(mean(x², -1) + eps) · gain, its backward written out (the module's docstring)."""

    @staticmethod
    def forward(ctx, x, gain, eps):
        r = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
        x_hat = x * r
        ctx.save_for_backward(x_hat, r, gain)
        return x_hat * gain

    @staticmethod
    def backward(ctx, dy):
        x_hat, r, gain = ctx.saved_tensors
        d_gain = (dy * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)
        dy_gain = dy * gain
        mean = (dy_gain * x_hat).mean(-1, keepdim=True)
        return dy_gain.sub_(x_hat * mean).mul_(r), d_gain, None


def _hand_backward(self, q_BHTD, k_BHTD):
    """QKNorm.prepare by ``HandBackward`` (q, k and the gains of one dtype here: the act study trains in fp32)."""
    return HandBackward.apply(q_BHTD, self.q_gain, self.eps), HandBackward.apply(k_BHTD, self.k_gain, self.eps)


PREPARE = {"F.rms_norm": _torch_rms_norm, "hand": _hand_backward}


@contextlib.contextmanager
def variant_code(variant: str):
    """QKNorm's prepare as ``variant`` has it inside the block ("off" and "ops": as it is on the CPU)."""
    if variant not in PREPARE:
        yield
        return
    own = QKNorm.__dict__["prepare"]
    QKNorm.prepare = PREPARE[variant]
    try:
        yield
    finally:
        QKNorm.prepare = own


@contextlib.contextmanager
def flushing(on: bool):
    if not torch.set_flush_denormal(on) and on:
        raise SystemExit("this CPU cannot flush subnormal floats (no SSE3)")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)  # the process's arithmetic as it was (a caller's tests run on after)


def one_variant(variant: str, flush: bool, args, corpus) -> float:
    """CPU seconds a step of ``variant`` over ``args.steps`` steps of a fresh run (seed 0)."""
    model = ModelConfig(vocab_size=corpus.vocab_size, head_dim=args.width,
                        scale="inv_sqrt_d" if variant == "off" else "qk_norm",
                        **{**ws.PilotConfig().model, "d_model": args.width, "norm": "pre"})
    cfg = replace(ws.recipe_train(steps=args.steps, warmup=min(10, args.steps - 1)), lr=act.LR, batch=args.batch,
                  checkpoint_every=0, eval_batches=1)
    with flushing(flush), variant_code(variant):
        start = time.process_time()
        train(model, cfg, corpus)
        return (time.process_time() - start) / args.steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--width", type=int, default=64, help="d_model and head width (the study's: 64)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    corpus = load_corpus("default")
    print(f"torch {torch.__version__}, {cpu_features()}; {args.rounds} rounds of {args.steps} steps a variant, "
          f"width {args.width}, batch {args.batch}; CPU time a step")
    runs = [(v, f) for f in FLUSH for v in VARIANTS]
    short = argparse.Namespace(**{**vars(args), "steps": min(args.steps, 20)})
    for v, f in runs:
        one_variant(v, f, short, corpus)  # warm-up: first calls
    times: dict[tuple[str, bool], list[float]] = {r: [] for r in runs}
    for r in range(args.rounds):
        for f in FLUSH[r % 2:] + FLUSH[:r % 2]:
            k = r % len(VARIANTS)
            for v in VARIANTS[k:] + VARIANTS[:k]:
                times[v, f].append(one_variant(v, f, args, corpus))
        print(f"round {r + 1}: " + ", ".join(f"{v}{' flushed' if f else ''} {1e3 * times[v, f][-1]:.2f} ms"
                                            for v, f in runs))
    for f in FLUSH:
        print(f"subnormals {'flushed to zero' if f else 'kept'}: " + ", ".join(
            f"{v} median {1e3 * statistics.median(times[v, f]):.2f} ms" for v in VARIANTS))
        for a, b in RATIOS:
            s = ratio_summary([x / y for x, y in zip(times[a, f], times[b, f])])
            ci = "" if s["interval"] is None else f" [{s['interval'][0]:.3f}, {s['interval'][1]:.3f}]"
            print(f"  {a}/{b} {s['mean']:.3f}{ci}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
