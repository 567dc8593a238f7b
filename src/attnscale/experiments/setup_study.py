"""Beyond the course: which setup decides how training ends at width 1,024?

The course's end state (without the scale the spread passes 5,000 and 99.9% of
rows freeze; with it the spread settles around 3.4) depends on more than the
scale. This study trains the tiny model at one head width, with and without the
scale, at a base setup and at one change of one setting at a time (one axis at
a time: learning rate, schedule, weight decay, init, norm placement, training
length), or at several changed together (a combined axis, ``study_axes.combine``:
the settings the single axes point to, to see whether together they reach what
none reaches alone), with seeds, and records the end of training of each run. The analysis
(``attnscale.analysis.setups``) says in which setups each of the course's
end-of-training claims holds in direction and in size.

A run's axis is its record group, ``study:<axis>`` (``study:base`` for the base
setup); its value is read back from its config, so the record says what ran.
The base runs are named like the dynamics and sweep runs (``d1024-none-s0``); with
``reuse`` a finished run of the very same config in another folder (a dynamics
run of ``reproduce``, under any name) is copied instead of trained twice.
Runs go to ``out/<run_id>`` through the same resumable runner as the sweep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from attnscale.errors import ConfigError
from attnscale import limits
from attnscale.experiments.dynamics import model_config
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.presets import budget, with_steps
from attnscale.lm.study_axes import AXES, GROUP_PREFIX, SCHEDULES, combined, known, label, parts, value_of
from attnscale.lm.train import TrainConfig
from attnscale.runs import store
from attnscale.runs.record import TrainRun
from attnscale.runs.runner import CorpusSpec, RunSpec, estimate, execute

__all__ = ["GROUP", "SIZES", "StudyConfig", "preset", "apply", "run_id", "specs", "run_records",
           "run", "format_table"]

GROUP = GROUP_PREFIX.rstrip(":")  # records: group "study:<axis>", "study:base" for the base setup
SIZES = ("smoke", "quick", "full")

def apply(model: dict[str, Any], train: TrainConfig, axis: str, value: Any) -> tuple[dict[str, Any], TrainConfig]:
    """The base (``model``, ``train``) with one setting changed, or each of a combined axis's in turn."""
    if combined(axis):
        if not known(axis):
            raise ConfigError(f"study combination {axis!r}: give two or more different axes of "
                              f"{', '.join(AXES)}, each once")
        if not isinstance(value, tuple) or len(value) != len(parts(axis)):
            raise ConfigError(f"study combination {axis} takes one value per axis, got {value!r}")
        for a, v in zip(parts(axis), value):
            model, train = apply(model, train, a, v)
        return model, train
    if axis not in AXES:
        raise ConfigError(f"unknown study axis {axis!r}; choose from: {', '.join(AXES)}")
    if axis == "steps":
        return model, with_steps(train, int(value))
    if axis == "schedule":
        if value not in SCHEDULES:
            raise ConfigError(f"schedule takes one of {', '.join(SCHEDULES)}, got {value!r}")
        if value == "cosine" and train.min_lr_ratio < 1.0:
            return model, train  # already cosine: keep its own floor
        return model, replace(train, min_lr_ratio=SCHEDULES[value])
    where, name = AXES[axis]
    if where == "model":
        return {**model, name: value}, train
    return model, replace(train, **{name: value})


@dataclass(frozen=True)
class StudyConfig(TrainingConfig):
    """One head width; the base setup (``model``: ModelConfig fields other than
    vocab_size, head_dim and scale; ``train``) and, per axis, the values tried
    instead of the base's (per combined axis, tuples: one value per axis it
    changes); every run once per scale and seed."""

    head_dim: int = 1024
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    seeds: tuple[int, ...] = (0, 1)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 1:
            raise ConfigError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        for name in ("scales", "seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{name} must be a non-empty list without repeats, got {values}")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds must be non-negative integers, got {self.seeds}")
        seen = set()
        for axis, values in self.axes:
            if axis in seen:
                raise ConfigError(f"study axis {axis!r} is given twice; give each axis once with all its values")
            seen.add(axis)
            applied = [apply(self.model, self.train, axis, v) for v in values]  # raises for a bad axis or value
            labels = [label(axis, v) for v in values]
            if len(set(labels)) != len(labels):
                raise ConfigError(f"study axis {axis}: values {', '.join(labels)} repeat; give each value once")
            for v, (model, train) in zip(values, applied):
                for a in parts(axis):  # a combination changes every one of its settings
                    if value_of(a, model, asdict(train)) == value_of(a, self.model, asdict(self.train)):
                        own = f"keeps the base setup's own {a}" if combined(axis) else "is the base setup's own value"
                        raise ConfigError(f"study axis {axis}: {label(axis, v)} {own}; give values that differ from it")
        limits.check(estimate(self._specs(1)), "lower --steps, the steps axis or the seeds")

    def _specs(self, vocab_size: int) -> list[RunSpec]:
        out = []
        for axis, value, model, train in self.settings():
            for seed in self.seeds:
                for scale in self.scales:
                    t = replace(train, seed=seed, **({} if self.device is None else {"device": self.device}))
                    out.append(RunSpec(run_id(self.head_dim, scale, seed, axis, value),
                                       model_config(model, vocab_size, self.head_dim, scale), t, f"{GROUP_PREFIX}{axis}"))
        return out

    def settings(self) -> list[tuple[str, Any, dict[str, Any], TrainConfig]]:
        """(axis, value, model, train) per setup, the base first (axis "base", value None)."""
        out = [("base", None, self.model, self.train)]
        for axis, values in self.axes:
            out += [(axis, v, *apply(self.model, self.train, axis, v)) for v in values]
        return out


def preset(size: str = "full", corpus: str = "default", seed: int = 0, tokenizer: str | None = None,
           vocab_size: int | None = None, model: dict[str, Any] | None = None,
           train: TrainConfig | None = None) -> StudyConfig:
    """The study at width 1,024, one axis at a time around a preset's setup, two seeds.

    - "quick": around the default budget (400 steps): learning rate ×3 and ×10, a constant schedule,
      weight decay off, unit init (larger q and k), pre-LN, half and the full budget's length;
      with ``--reuse`` the full-length rows are the runs ``reproduce --full`` trained;
    - "full": around the full budget (``reproduce --full``'s 1,200 steps), both directions where
      an axis has them (learning rate ÷3, ×3 and ×10, both other inits, half and twice the length),
      several times the quick one's runs and steps (what a study took: docs/setup-study.md);
    - "smoke": width 64, around the quick budget, two axes of one value each, 20 steps:
      a check that the study and its report section work, not a measurement.

    ``model`` and ``train``, when given, replace the budget's base (the command line's
    --steps, --lr, --batch, --context) and the axes' values are taken around them."""
    if size not in SIZES:
        raise ConfigError(f"unknown study preset {size!r}; choose one of: {', '.join(SIZES)}")
    vocab = vocab_size if vocab_size is not None else CorpusSpec(corpus, tokenizer).load().vocab_size
    if size == "smoke":
        b = budget("quick", vocab)
        return StudyConfig(corpus=corpus, tokenizer=tokenizer, head_dim=64, seeds=(seed, seed + 1),
                           axes=(("lr", (b.train.lr * 3,)), ("norm", ("pre",))),
                           model=b.model, train=with_steps(b.train, 20))
    b = budget("full" if size == "full" else "default", vocab)
    model, train = model if model is not None else b.model, train if train is not None else b.train
    lr, steps = train.lr, train.steps
    full = size == "full"
    full_steps = budget("full", vocab).train.steps
    longer = full_steps if not full and steps < full_steps else steps * 2
    inits = tuple(i for i in (("gpt2", "unit") if full else ("unit",)) if i != model.get("init"))
    lrs = ((float(f"{lr / 3:.1g}"),) if full else ()) + (float(f"{lr * 3:.1g}"), float(f"{lr * 10:.1g}"))
    axes = (("lr", tuple(dict.fromkeys(x for x in lrs if x != lr))),
            ("schedule", ("constant" if train.min_lr_ratio < 1 else "cosine",)),
            ("weight_decay", (0.0,) if train.weight_decay > 0 else (0.1,)),
            ("init", inits),
            ("norm", ("pre" if model.get("norm") == "post" else "post",)),
            ("steps", tuple(x for x in (steps // 2, longer) if x >= 1)))
    return StudyConfig(corpus=corpus, tokenizer=tokenizer, seeds=(seed, seed + 1),
                       axes=tuple((a, v) for a, v in axes if v), model=model, train=train)


def run_id(head_dim: int, scale: str, seed: int, axis: str, value: Any) -> str:
    """The base's runs are named as dynamics and sweep name theirs; the others add ``-<axis>-<value>``
    per setting they change (``d1024-none-s0-schedule-constant-weight_decay-0``)."""
    base = store.run_id(head_dim, scale, seed)
    if axis == "base":
        return base
    values = value if combined(axis) else (value,)
    return "-".join([base, *(f"{a}-{label(a, v)}" for a, v in zip(parts(axis), values))])


def specs(cfg: StudyConfig, vocab_size: int) -> list[RunSpec]:
    """One run per setup × seed × scale, the base setup first."""
    out = cfg._specs(vocab_size)
    limits.check(estimate(out), "lower --steps, the steps axis or the seeds")
    return out


def run_records(cfg: StudyConfig, out: Path, jobs: int = 1, progress: bool = True, reuse: Sequence[Path] = (),
                executor: str = "local", ray_address: str | None = None) -> list[TrainRun]:
    """Train every run not yet finished under ``out/<run_id>``; return every run as read back."""
    corpus = cfg.corpus_spec.load()
    return execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs, progress=progress,
                   corpus=corpus, reuse=reuse, executor=executor, ray_address=ray_address)


def run(cfg: StudyConfig, out: Path, jobs: int = 1, progress: bool = True, reuse: Sequence[Path] = (),
        executor: str = "local", ray_address: str | None = None) -> dict[str, Any]:
    """Train what is missing; return {"rows": per setup and scale, "claims": across setups}."""
    from attnscale.analysis import setups

    runs = run_records(cfg, out, jobs, progress, reuse=reuse, executor=executor, ray_address=ray_address)
    rows = setups.summary_rows([setups.run_row(t) for t in runs])
    return {"rows": rows, "claims": setups.claims(rows)}


def format_table(result: dict[str, Any]) -> str:
    """Per setup: end spread, frozen share, effective words and perplexity without and with the scale."""
    from attnscale.analysis import setups

    return setups.format_text(result["rows"], result["claims"])
