"""``TrainConfig``: a training run's budget, recipe and recording, each field checked when it is made; and the
learning-rate schedule ``lr_at`` (a linear warm-up, then a cosine or warm-up-stable-decay to a floor)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnscale.core import device as dev
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError, check_positive_ints
from attnscale.lm.optimizers import OPTIMIZERS

__all__ = ["ATTENTION", "SCHEDULES", "WSD_STABLE", "WEIGHTS", "MAX_SKIPPED", "TrainConfig", "lr_at"]

ATTENTION = ("auto", "fused", "explicit")
SCHEDULES = ("cosine", "wsd")
# wsd: the share of the steps before the cool-down (warm-up included). Held long enough that the
# constant phase, not the decay, decides where the weights go; the last fifth cools them.
WSD_STABLE = 0.8
WEIGHTS = ("fp32", "bf16")
# fp16 steps the scaler may skip in a row before the run counts as diverged: each skip halves the
# loss scale, so 40 take 2**16 below 1e-7, where no gradient can overflow any more
MAX_SKIPPED = 40


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation budget and recording. ``eval_batches=None`` evaluates the whole valid split.

    ``dtype``: "fp32", "bf16" (autocast: matmuls in bf16, softmax and loss in
    fp32), "fp16" (GPUs: autocast with a gradient scaler) or "auto" (bf16 where
    the CPU or GPU computes in it natively; fp16 on Volta and Turing; else fp32;
    the resolved one is in the results). ``device``: "auto" (CUDA, else MPS, else
    CPU), "cpu", "cuda", "cuda:N" or "mps". ``attention``: the path of steps
    that do not record: "fused" (SDPA, for every scheme it can express),
    "explicit", or "auto" (fused on GPUs and on the CPU in fp32; the model config's ``impl``
    on the CPU in bf16).
    ``weights``: "fp32" (autocast casts each weight to the compute dtype in every forward, and its
    gradient back in every backward) or "bf16": where the precision is bf16, the step computes on a
    bf16 copy of the weights without autocast (the scores' softmax and the loss still in fp32), and
    the optimiser updates fp32 master weights, from which the copy is refreshed once a step, in one
    call; in fp32 (dtype "auto" on a CPU without native bf16) nothing changes. The master weights
    are the model: checkpoints, evaluation and saved weights read them.
    ``optimizer``: "adamw" (every parameter) or "muon": ``torch.optim.Muon`` (rate matched to AdamW's RMS,
    ``adjust_lr_fn="match_rms_adamw"``) for the blocks' 2-D matrices (q, k, v, output projections, MLP) and
    AdamW, with these betas, eps and rate, for the embeddings, read-out, norms, biases and the score scale's
    parameters; ``weight_decay`` on every matrix either way (``lm.optimizers``).
    ``device``, ``threads``, ``attention`` and ``checkpoint_every`` decide how a
    run executes, not what it measures: a run resumed with others is the same run."""

    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    beta2: float = 0.99
    record_every: int = 10
    record_sequences: int = 4
    eval_batches: int | None = 20
    seed: int = 0
    dtype: str = "fp32"
    threads: int | None = None
    frozen_threshold: float = FROZEN_THRESHOLD
    checkpoint_every: int = 0
    device: str = "auto"
    attention: str = "auto"
    weights: str = "fp32"
    # Wortsman et al. 2023's recipe (the warn study): the defaults are the loop as it was
    z_loss: float = 0.0  # coef · mean(log Z)² added to the loss a step minimises, Z the output softmax's sum
    beta1: float = 0.9
    adam_eps: float = 1e-8
    independent_wd: bool = False  # weight_decay shrinks by itself × lr_t/lr a step, not by itself × lr_t
    schedule: str = "cosine"
    eval_every: int = 0
    optimizer: str = "adamw"  # or "muon": Muon on the blocks' matrices, AdamW on the rest (lm/optimizers.py)

    def __post_init__(self):
        check_positive_ints(self, ("steps", "batch", "record_every", "record_sequences"), "train")
        for name in ("lr", "min_lr_ratio", "weight_decay", "clip", "beta2", "z_loss", "beta1", "adam_eps",
                     "frozen_threshold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise ConfigError(f"train {name} must be a number, got {v!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"train warmup must be a non-negative integer, got {self.warmup!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < math.inf):
            raise ConfigError(f"train lr must be a positive number, got {self.lr!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"train min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")
        if not 0 <= self.weight_decay < math.inf or not 0 < self.clip < math.inf or not 0 <= self.beta2 < 1:
            raise ConfigError("train weight_decay must be >= 0, clip > 0 and beta2 in [0, 1)")
        if self.eval_batches is not None and (not isinstance(self.eval_batches, int) or self.eval_batches < 1):
            raise ConfigError(f"train eval_batches must be a positive integer or None (all), got {self.eval_batches!r}")
        if self.dtype not in dev.DTYPES:
            raise ConfigError(f"train dtype {self.dtype!r} is unknown; choose one of: {', '.join(dev.DTYPES)}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ConfigError(f"train threads must be a positive integer or None, got {self.threads!r}")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise ConfigError(f"train checkpoint_every must be a non-negative integer (0 = never), got {self.checkpoint_every!r}")
        dev.check_device_spec(self.device)
        if self.attention not in ATTENTION:
            raise ConfigError(f"train attention {self.attention!r} is unknown; choose one of: {', '.join(ATTENTION)}")
        if self.weights not in WEIGHTS:
            raise ConfigError(f"train weights {self.weights!r} are unknown; choose one of: {', '.join(WEIGHTS)}")
        if self.weights == "bf16" and self.dtype not in ("bf16", "auto"):
            raise ConfigError(f"train weights 'bf16' need dtype bf16 (or auto), not {self.dtype!r}; "
                              "drop --weights bf16 or train in bf16")
        if not (0 <= self.z_loss < math.inf and 0 <= self.beta1 < 1 and 0 < self.adam_eps < 1):
            raise ConfigError("train z_loss must be >= 0, beta1 in [0, 1) and adam_eps in (0, 1)")
        if not isinstance(self.independent_wd, bool):
            raise ConfigError(f"train independent_wd must be true or false, got {self.independent_wd!r}")
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"train optimizer {self.optimizer!r} is unknown; choose one of: {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train schedule {self.schedule!r} is unknown; choose one of: {', '.join(SCHEDULES)}")
        if self.schedule == "wsd" and self.warmup > int(WSD_STABLE * self.steps):
            raise ConfigError(f"train warmup {self.warmup} runs past the wsd cool-down at step "
                              f"{int(WSD_STABLE * self.steps)}; shorten the warm-up or train longer")
        if not isinstance(self.eval_every, int) or isinstance(self.eval_every, bool) or self.eval_every < 0:
            raise ConfigError(f"train eval_every must be a non-negative integer (0 = at the end only), got {self.eval_every!r}")
        if not 0 < self.frozen_threshold < 1:
            raise ConfigError(f"train frozen_threshold must lie in (0, 1), got {self.frozen_threshold!r}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then the schedule's decay to ``lr·min_lr_ratio``,
    reached at step ``steps`` (one past the last update). "cosine": a half cosine from the warm-up on;
    "wsd": ``lr`` held to step ``int(WSD_STABLE·steps)``, then a straight line down."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        stable = int(WSD_STABLE * cfg.steps)  # below steps for every run (steps >= 1)
        return cfg.lr - (cfg.lr - floor) * min(1.0, max(0, step - stable) / (cfg.steps - stable))
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
