"""Budgets: the model and training settings of each preset, in one place.

``budget(name, vocab_size)`` is what ``reproduce``, ``dynamics``, ``sweep`` and
``train`` start from; the fresh-head experiment's "model" init reads the same
model settings. Sized for a laptop CPU of two cores.

Why these choices: post-LN with PyTorch's default init is the model whose first head starts at the
course's spread, about sqrt(d)·2/3; ``dtype="auto"`` trains in bf16 autocast (softmax in fp32) where
the CPU has native bf16, since it is faster there and, at the default budget, its perplexities match
fp32's within seed noise (docs/results.md, "By precision", has where that is not settled; docs/speed.md),
and in fp32 elsewhere. Every preset records every
10 steps, so the sweep's width-1,024 pair doubles as the dynamics pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from attnscale.errors import ConfigError
from attnscale.lm.train import TrainConfig

__all__ = ["Budget", "budget", "end_state_budget", "END_STATE_HEADS", "preset_name", "with_steps", "model_settings", "PRESETS", "LARGE_VOCAB",
           "CHECKPOINT_EVERY", "FULL_STEPS", "FULL_SEEDS"]

PRESETS = ("quick", "default", "full")
# A word-level vocabulary (WikiText-2: 33,278 words) makes the output layer cost
# more than the rest of the tiny model at every width (measured: 0.7 s of CPU a
# step at width 32, 0.9 at 1,024, batch 16); on such corpora the default budget
# halves the batch, keeping the number of updates and the schedule, so the
# course's sweep (12 runs) fits ~15 minutes on 2 cores.
LARGE_VOCAB = 8192
CHECKPOINT_EVERY = 100  # default runs save a checkpoint this often, so a killed run resumes mid-way
FULL_STEPS = 1200  # see budget("full")
FULL_SEEDS = 3  # with 2, an SE has 1 degree of freedom and a 95% interval is ± 12.7 SE: verdicts flip

_MODEL = {"context": 64, "d_model": 64, "n_layers": 2, "n_heads": 4, "init": "torch", "norm": "post", "impl": "explicit"}


@dataclass(frozen=True)
class Budget:
    """``model``: ModelConfig fields other than vocab_size, head_dim and scale, which
    each run sets (``ModelConfig(vocab_size=..., head_dim=width, scale=s, **model)``)."""

    name: str
    model: dict[str, Any] = field(default_factory=lambda: dict(_MODEL))
    train: TrainConfig = field(default_factory=TrainConfig)
    seeds: int = 1  # seeds per width and scheme in the sweep (and dynamics pairs in reproduce)


def budget(name: str = "default", vocab_size: int = 0) -> Budget:
    """The named preset, sized by the corpus's vocabulary (0: a small, character-level one)."""
    if name == "quick":  # the embedded corpus, a few seconds a run
        return Budget(name, {**_MODEL, "context": 32},
                      TrainConfig(steps=60, batch=8, lr=3e-3, warmup=6, record_every=10, eval_batches=8, dtype="auto"))
    if name == "default":
        # eval_batches=None: perplexity over the whole held-out split, not a sample of it
        train = TrainConfig(steps=400, batch=16, lr=3e-3, warmup=40, record_every=10, eval_batches=None,
                            dtype="auto", checkpoint_every=CHECKPOINT_EVERY)
        if vocab_size > LARGE_VOCAB:
            train = replace(train, batch=train.batch // 2)
        return Budget(name, dict(_MODEL), train)
    if name == "full":
        # the default setup trained 3x longer, FULL_SEEDS seeds for standard errors; a checkpoint every 100
        # steps (about a minute of the widest run on one CPU core) so a kill loses minutes
        b = budget("default", vocab_size)
        return Budget(name, b.model, with_steps(b.train, FULL_STEPS), FULL_SEEDS)
    raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")


def preset_name(quick: bool = False, full: bool = False) -> str:
    """The budget ``--quick`` / ``--full`` ask for ("default" for neither)."""
    if quick and full:
        raise ConfigError("--quick and --full ask for two presets; give one of them")
    return "quick" if quick else "full" if full else "default"


def with_steps(train: TrainConfig, steps: int) -> TrainConfig:
    """``train`` cut (or stretched) to ``steps`` updates; the warm-up keeps to at most a tenth of them."""
    return replace(train, steps=steps, warmup=min(train.warmup, steps // 10))


def model_settings() -> dict[str, Any]:
    """The model ``reproduce`` trains (the default preset's), without vocab_size, head_dim and scale."""
    return dict(_MODEL)


# The end-state run's heads: one, since a step's time grows with the heads at d = 1,024 and one head is
# what lets its four 7,200-step runs fit about an hour of two cores (docs/end-state.md has the timings).
END_STATE_HEADS = 1


def end_state_budget() -> Budget:
    """The long run designed to reach the course's end of training: the default model (post-LN,
    torch init, d_model 64, 2 layers, context 64) with ``END_STATE_HEADS`` heads, batch 16, AdamW
    lr 3e-3, β2 0.99, weight decay 0.1, clip 1, warm-up 40, 7,200 steps held constant to 80% and
    then cooled linearly to 0.1× (the constant phase grows the unscaled spread; the cool-down lets
    the scaled one settle); a record every 200 steps, the held-out loss every 1,200 (many epochs of a
    small corpus: overfitting would show there). fp32, so the verdict does not hang on bf16."""
    train = TrainConfig(steps=7200, batch=16, lr=3e-3, warmup=40, min_lr_ratio=0.1, weight_decay=0.1, clip=1.0,
                        beta2=0.99, record_every=200, eval_every=1200, eval_batches=None, dtype="fp32",
                        schedule="wsd", checkpoint_every=200)
    return Budget("end-state", {**_MODEL, "n_heads": END_STATE_HEADS}, train, seeds=2)
