"""What a request will cost, estimated before anything is allocated, and refused when it cannot fit.

Every experiment config calls one of these from its checks, so a request that
could never finish (tensors larger than the machine's memory, or weeks of
compute) fails at once with a ConfigError that gives the estimate and the limit,
from the command line and from Python alike.

The estimates are deliberately on the low side: memory counts only the largest
tensors alive at once (float32), time assumes a rate no laptop reaches
(``OPS_PER_S``; measured rates: docs/speed.md). A refusal is therefore certain
to be a request that would not have fitted, while anything near the limits is
left to run.

Limits: the machine's physical memory, and ``ATTNSCALE_MAX_HOURS`` of compute
(default 72 hours) for one command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from attnscale.errors import ConfigError

__all__ = ["Estimate", "memory_limit", "hours_limit", "check", "spread_cost", "fresh_cost", "training_cost", "head_dims_cost",
           "OPS_PER_S", "CPU_OPS_PER_S", "FLOAT_BYTES"]

OPS_PER_S = 1e12  # optimistic on purpose: a refusal must never be a run that would have finished
# The reference CPU's rate, one fp32 training process on one thread (measured: docs/speed.md): the
# presets' budgets are held to it (tests/lm/test_full_preset.py); ETAs use the rate measured on the
# machine that trains (``runs.pace``), never this one.
CPU_OPS_PER_S = 3.3e10
FLOAT_BYTES = 4
DEFAULT_HOURS = 72.0


@dataclass(frozen=True)
class Estimate:
    what: str  # the request, in words: "20,000 pairs at d=1,024"
    bytes: float  # the largest tensors alive at once
    ops: float  # arithmetic operations (or numbers drawn), all of it

    @property
    def seconds(self) -> float:
        return self.ops / OPS_PER_S


def memory_limit() -> int:
    """This machine's physical memory, in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a laptop
        return 16 << 30


def hours_limit() -> float:
    """``ATTNSCALE_MAX_HOURS`` (a positive number), else 72."""
    text = os.environ.get("ATTNSCALE_MAX_HOURS")
    if not text:
        return DEFAULT_HOURS
    try:
        hours = float(text)
    except ValueError:
        hours = -1.0
    if not 0 < hours < float("inf"):
        raise ConfigError(f"ATTNSCALE_MAX_HOURS must be a positive number of hours, got {text!r}")
    return hours


def _size(n: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= k:
            return f"{n / k:,.1f} {unit}"
    return f"{n / 1e3:,.0f} kB"


def _duration(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:,.0f} days"
    if s >= 2 * 3600:
        return f"{s / 3600:,.0f} hours"
    return f"{s / 60:,.0f} minutes"


def check(est: Estimate, fix: str) -> Estimate:
    """Raise a one-line ConfigError when ``est`` exceeds the memory or time limit; ``fix`` says what to lower."""
    mem = memory_limit()
    if est.bytes > mem:
        raise ConfigError(f"{est.what} needs at least {_size(est.bytes)} of memory at once; this machine has "
                          f"{_size(mem)}; {fix}")
    hours = hours_limit()
    if est.seconds > hours * 3600:
        raise ConfigError(f"{est.what} would take at least {_duration(est.seconds)} (at {OPS_PER_S:.0e} operations/s); "
                          f"the limit is {hours:g} hours (ATTNSCALE_MAX_HOURS); {fix}")
    return est


def spread_cost(head_dims: tuple[int, ...], pairs: int, schemes: int, chunk: int) -> Estimate:
    """``experiments.spread``: q and k are drawn ``chunk`` numbers at a time (at least one pair),
    and every raw and scaled score is kept to take its spread (two float64 copies in the SE)."""
    widest = max(head_dims)
    per_chunk = 2 * max(chunk, widest) * FLOAT_BYTES
    kept = pairs * (1 + schemes) * FLOAT_BYTES + 2 * pairs * 8
    ops = sum(2 * pairs * w * (2 + schemes) for w in head_dims)
    return Estimate(f"spread over {pairs:,} pairs at d={widest:,}", per_chunk + kept, ops)


def fresh_cost(head_dims: tuple[int, ...], words: int, sequences: int, schemes: int) -> Estimate:
    """``experiments.fresh``: q, k (sequences × words × d) and about three sequences × words × words
    tensors (scores, weights, the row statistics) for the widest width at once."""
    widest = max(head_dims)
    tensors = (2 * sequences * words * widest + 3 * sequences * words * words) * FLOAT_BYTES
    ops = sum(schemes * sequences * words * (2 * words * w + 2 * w + 10 * words) for w in head_dims)
    return Estimate(f"a fresh head over {sequences:,} sequences of {words:,} words at d={widest:,}", tensors, ops)


def training_cost(*, vocab: int, context: int, d_model: int, n_layers: int, n_heads: int, head_dim: int,
                  mlp_ratio: int, batch: int, steps: int, runs: int = 1) -> Estimate:
    """One training step of the tiny LM (``lm.model``), times ``steps`` and ``runs``.

    Memory: weights, gradients and AdamW's two moments (4 copies), plus the
    activations kept for the backward pass: per layer q, k, v and the heads'
    output (B·T·H·d_k each), scores and weights (B·H·T·T, twice), the MLP
    (B·T·mlp·d_model); and the logits (B·T·V). Operations: 6 per weight per
    token (forward and backward), plus the two attention products."""
    inner = n_heads * head_dim
    per_layer = 4 * d_model * inner + 2 * mlp_ratio * d_model * d_model
    params = 2 * vocab * d_model + context * d_model + n_layers * per_layer
    tokens = batch * context
    acts = n_layers * (4 * tokens * inner + 2 * batch * n_heads * context * context + tokens * mlp_ratio * d_model)
    acts += 2 * tokens * vocab
    attention_ops = n_layers * 12 * batch * n_heads * context * context * head_dim
    ops = steps * runs * (6 * tokens * params + attention_ops)
    return Estimate(_training_words(runs, steps, batch, context, head_dim), (4 * params + acts) * FLOAT_BYTES, ops)


def head_dims_cost(runs_per_head_dim: dict[int, int], **shape: int) -> Estimate:
    """``training_cost`` of ``runs_per_head_dim`` (head width -> runs at it; ``shape``: the other
    arguments): the memory of the widest run (runs train one after another in a
    process), the operations of them all."""
    costs = {w: training_cost(head_dim=w, runs=n, **shape) for w, n in runs_per_head_dim.items()}
    widest = max(costs, key=lambda w: costs[w].bytes)
    what = _training_words(sum(runs_per_head_dim.values()), shape["steps"], shape["batch"], shape["context"], widest)
    return Estimate(what, costs[widest].bytes, sum(c.ops for c in costs.values()))


def _training_words(runs: int, steps: int, batch: int, context: int, head_dim: int) -> str:
    return (f"training {runs} run{'s' if runs != 1 else ''} of {steps:,} steps (batch {batch:,}, context {context:,}, "
            f"head width {head_dim:,})")
