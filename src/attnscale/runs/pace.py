"""How fast this machine trains: the one rate that every ETA of a set of runs comes from.

Work is counted in arithmetic operations (``limits.training_cost``), the unit all
runs share whatever their width: a step at d=1,024 costs about ten at d=32, so a
pace counted in steps would make the first runs a poor guide to the rest. The
pace is measured here, not assumed: ``measure`` times a few steps of the dearest
and the cheapest run on this machine (its device, precision and thread count)
before anything trains, since a small step costs more than its operations say
(Python and kernel launches); ``Pace`` then keeps what each run finished in this
invocation took against what was predicted for it (``observe``, called by
``runs.progress`` as each run ends), so every later estimate follows what the
machine actually did: a machine loaded by other work, or slower once two runs
share its cores, corrects the estimate after its first finished run, not after a
whole stage.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

from attnscale import limits

__all__ = ["Pace", "measure", "run_cost", "step_ops"]

WARMUP_STEPS = 1  # the first step pays for allocation and kernel selection: not timed
TIMED_STEPS = 5  # the median of their times: one step slowed by another process does not move it


def run_cost(spec) -> limits.Estimate:
    """What training one run (a ``runs.runner.RunSpec``) costs: its ``limits.training_cost``."""
    m, t = spec.model, spec.train
    return limits.training_cost(vocab=m.vocab_size, context=m.context, d_model=m.d_model, n_layers=m.n_layers,
                                n_heads=m.n_heads, head_dim=m.head_dim or m.d_model // m.n_heads,
                                mlp_ratio=m.mlp_ratio, batch=t.batch, steps=t.steps)


def step_ops(spec) -> float:
    """The operations of one training step of ``spec``."""
    return run_cost(spec).ops / max(1, spec.train.steps)


def _step_seconds(spec, corpus, threads: int, steps: int) -> float:
    """Seconds a training step of ``spec`` takes here: the median of ``steps`` steps of the
    real training loop timed after a warm-up step; nothing is written."""
    from attnscale.lm.train import train

    stamps: list[float] = []
    train(spec.model, replace(spec.train, threads=threads, checkpoint_every=0), corpus,
          on_step=lambda step, total, info: stamps.append(time.perf_counter()),
          should_stop=lambda: len(stamps) >= WARMUP_STEPS + steps)
    timed = stamps[WARMUP_STEPS - 1:]
    return statistics.median(b - a for a, b in zip(timed, timed[1:])) if len(timed) > 1 else 0.0


def measure(specs, corpus, threads: int, steps: int = TIMED_STEPS) -> Pace:
    """This machine's pace for ``specs``: the dearest and the cheapest step among them timed,
    and a line fitted through the two (a step's fixed cost, plus a cost per operation), so
    that runs of every width are estimated from what was measured, not from a constant."""
    dear = max(specs, key=step_ops)
    cheap = min(specs, key=step_ops)
    t_dear = _step_seconds(dear, corpus, threads, steps)
    if step_ops(dear) < 2 * step_ops(cheap):  # too close to tell a fixed cost from a cost per operation
        return Pace(0.0, t_dear / step_ops(dear), timed=(dear.run_id,))
    t_cheap = _step_seconds(cheap, corpus, threads, steps)
    per_op = (t_dear - t_cheap) / (step_ops(dear) - step_ops(cheap))
    if per_op <= 0:  # noise larger than the difference: the dear step alone, all of it per operation
        return Pace(0.0, t_dear / step_ops(dear), timed=(dear.run_id, cheap.run_id))
    return Pace(max(0.0, t_cheap - step_ops(cheap) * per_op), per_op, timed=(dear.run_id, cheap.run_id))


@dataclass
class Pace:
    """Seconds a run takes here: ``steps × (step_s + its step's operations × op_s)`` for one
    process, as measured before training, times the ratio of what the runs finished since took
    to what they were predicted to take."""

    step_s: float  # the fixed cost of a step: Python, kernel launches, the optimiser's loop
    op_s: float  # seconds per operation of ``limits.training_cost``
    timed: tuple[str, ...] = ()  # the runs whose steps were timed
    predicted_s: float = 0.0  # process-seconds the runs finished so far were predicted to take
    actual_s: float = 0.0  # and what they took

    def step_seconds(self, spec) -> float:
        """One step of ``spec`` in one process, before correction."""
        return self.step_s + step_ops(spec) * self.op_s

    def run_seconds(self, spec) -> float:
        """One process training ``spec`` from its first step to its last, before correction."""
        return spec.train.steps * self.step_seconds(spec)

    def factor(self) -> float:
        return self.actual_s / self.predicted_s if self.predicted_s > 0 and self.actual_s > 0 else 1.0

    def seconds(self, specs, workers: int = 1) -> float:
        """The wall time training ``specs`` takes with ``workers`` processes side by side."""
        return sum(self.run_seconds(s) for s in specs) * self.factor() / max(1, workers)

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """A run predicted (``step_seconds`` × the steps it trained) to take ``predicted_s`` in its
        process took ``actual_s``, from its start to its end: its start-up and evaluation included,
        which the timed steps leave out, and whatever else loaded the machine meanwhile."""
        if predicted_s > 0 and actual_s > 0:
            self.predicted_s += predicted_s
            self.actual_s += actual_s
