"""Beyond the course: which scale keeps attention healthy as heads widen and learning rates grow?

Trains the tiny model for every scheme × head width × learning rate × seed,
same budget, and measures per run the final held-out loss, divergence, the
largest attention logit over training (logit growth, Wortsman et al. 2023) and
the lowest effective words of any head (entropy collapse, Zhai et al. 2023);
per scheme and width, the learning-rate sensitivity with a standard error over
seeds. The numbers are computed by ``attnscale.analysis.schemes``.

Runs go to ``out/<run_id>`` with record group "schemes" through the
same resumable runner as the sweep: an interrupted study, rerun, trains only what is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from attnscale.core.scales import display_name, scale_names
from attnscale.errors import ConfigError
from attnscale.experiments import sweep
from attnscale.experiments.training_config import TrainingConfig, default_train
from attnscale.lm.presets import budget
from attnscale.runs.record import TrainRun
from attnscale.runs.runner import CorpusSpec, execute
from attnscale.terminal import table

__all__ = ["SchemesConfig", "preset", "lr_grid", "specs", "run_records", "run", "rows_from_records", "format_table",
           "SIZES", "GROUP"]

GROUP = "schemes"
SIZES = ("smoke", "quick", "full")


def lr_grid(center: float, points: int = 5, span: float = 10.0) -> tuple[float, ...]:
    """``points`` learning rates evenly spaced in log from center/span to center·span (center included when odd)."""
    if points < 2:
        raise ConfigError(f"an LR grid needs at least 2 points, got {points}")
    lo = math.log(center / span)
    step = 2 * math.log(span) / (points - 1)
    return tuple(float(f"{math.exp(lo + i * step):.2g}") for i in range(points))  # 2 digits: 9.5e-4, not 9.49e-4


def _default_lrs() -> tuple[float, ...]:
    return lr_grid(default_train().lr)  # 3e-4 … 3e-2 around lm/presets.py's 3e-3


@dataclass(frozen=True)
class SchemesConfig(TrainingConfig):
    """Schemes × head widths × learning rates × seeds. ``model`` holds ModelConfig
    fields other than vocab_size, head_dim and scale; ``train.seed`` and
    ``train.lr`` are set per run. ``device``, when given, is where every run trains."""

    scales: tuple[str, ...] = field(default_factory=lambda: tuple(scale_names()))
    head_dims: tuple[int, ...] = (64, 256, 1024)
    lrs: tuple[float, ...] = field(default_factory=_default_lrs)
    seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self):
        super().__post_init__()
        _ = self.as_sweep  # the sweep's checks: lists without repeats, positive widths, known schemes, valid lrs

    @property
    def as_sweep(self) -> sweep.SweepConfig:
        """The same runs as a sweep (the sweep already crosses schemes, widths, seeds and lrs)."""
        return sweep.SweepConfig(corpus=self.corpus, tokenizer=self.tokenizer, head_dims=self.head_dims, scales=self.scales,
                                 seeds=self.seeds, lrs=self.lrs, model=self.model, train=self.train,
                                 device=self.device)

    @property
    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(self.corpus, self.tokenizer)


def preset(size: str = "full", corpus: str = "default", seed: int = 0, tokenizer: str | None = None,
           vocab_size: int | None = None) -> SchemesConfig:
    """Every registered scheme over an LR grid from 10× below to 10× above the preset's rate.

    - "full": widths 64, 256, 1,024, seeds 0–2, on the sweep's budget (400 steps; 270 runs);
    - "quick": widths 64 and 256, seeds ``seed`` and ``seed + 1`` (two, for error
      bars), on the quick budget (60 steps; 120 runs): ``reproduce``'s stage, small
      enough to keep it within 8 minutes (what each took: docs/schemes-study.md);
    - "smoke": width 64, three learning rates, one seed, 15 steps: ``reproduce --quick``'s stage, a
      check that the stage and its report section work (18 short runs), not a measurement."""
    if size not in SIZES:
        raise ConfigError(f"unknown schemes preset {size!r}; choose one of: {', '.join(SIZES)}")
    vocab = vocab_size if vocab_size is not None else CorpusSpec(corpus, tokenizer).load().vocab_size
    b = budget("default" if size == "full" else "quick", vocab)
    model, train_cfg = b.model, b.train
    base = SchemesConfig(corpus=corpus, tokenizer=tokenizer, model=model, train=train_cfg,
                         seeds=(seed, seed + 1, seed + 2))
    if size == "quick":
        return replace(base, head_dims=(64, 256), seeds=(seed, seed + 1))
    if size == "smoke":
        return replace(base, head_dims=(64,), seeds=(seed,), lrs=lr_grid(train_cfg.lr, 3),
                       train=replace(train_cfg, steps=15, warmup=2))
    return base


def specs(cfg: SchemesConfig, vocab_size: int):
    return sweep.specs(cfg.as_sweep, vocab_size, group=GROUP)


def run_records(cfg: SchemesConfig, out: Path, jobs: int = 1, progress: bool = True,
                reuse: Sequence[Path] = (), executor: str = "local", ray_address: str | None = None,
                pace=None, corpus=None) -> list[TrainRun]:
    """Train every run not yet finished under ``out/<run_id>`` (on ``executor``: "local" or "ray");
    return every run as read back. ``corpus``: the config's corpus, where the caller has loaded it already."""
    corpus = corpus if corpus is not None else cfg.corpus_spec.load()
    return execute(specs(cfg, corpus.vocab_size), cfg.corpus_spec, Path(out), jobs=jobs, progress=progress,
                   corpus=corpus, reuse=reuse, executor=executor, ray_address=ray_address, pace=pace)


def rows_from_records(runs: list[TrainRun]) -> list[dict[str, Any]]:
    """The plain per-run dicts ``analysis.schemes.summary_rows`` takes, read from the runs' records."""
    from attnscale.analysis.schemes import run_row

    return [run_row(t) for t in runs]


def run(cfg: SchemesConfig, out: Path, jobs: int = 1, progress: bool = True, executor: str = "local",
        ray_address: str | None = None, pace=None) -> dict[str, Any]:
    """Train what is missing; return {"runs": per-run rows, "summary": per scheme and width, "unigram": a
    unigram model's held-out loss on the corpus, "plateau": the grid ends within
    ``analysis.schemes.PLATEAU_NATS`` of it or above}, what the report's section reads from the same records."""
    from attnscale.analysis import schemes as sa

    corpus = cfg.corpus_spec.load()
    runs = rows_from_records(run_records(cfg, out, jobs, progress, executor=executor, ray_address=ray_address,
                                         pace=pace, corpus=corpus))
    summary = sa.summary_rows(runs)
    unigram = sa.unigram_loss(corpus.train.tolist(), corpus.valid.tolist(), corpus.vocab_size)
    finished = [r for r in runs if r["status"] in ("done", "diverged")]
    plateau = sa.plateau_ends(summary, sa.loss_curves(finished), unigram)
    return {"runs": runs, "summary": summary, "unigram": unigram, "plateau": plateau}


def format_table(result: dict[str, Any]) -> str:
    """Per scheme and width: LR sensitivity ± SE, best loss ± SE and its LR, divergences, max |logit|, collapse."""
    from attnscale.analysis.estimates import plus_minus
    from attnscale.analysis.schemes import COLLAPSE_WORDS, reading

    def _pm(mean, se, fmt="{:.3f}"):
        return plus_minus(mean, se, fmt, terminal=True)

    rows = result["summary"]
    lines = table(
        ("width", "scale", "LR sensitivity", "best loss", "best lr", "diverged", "max|logit| top lr", "min eff.w",
         "collapsed"),
        ([r["head_dim"], display_name(r["scale"]), _pm(r["sensitivity"], r["sensitivity_se"]),
          _pm(r["best_loss"], r["best_loss_se"]), "-" if r["best_lr"] is None else format(r["best_lr"], "g"),
          f"{r['diverged']}/{r['runs']}", _pm(*r["max_logit_high_lr"], fmt="{:.1f}"),
          "-" if r["min_effective_words"] is None else format(r["min_effective_words"], ".2f"),
          f"{r['collapsed_heads']}/{r['heads']}"] for r in rows),
        "><>>>>>>>")
    lines.append("LR sensitivity: mean over the LR grid of min(final loss, loss at init) − best final loss (nats; "
                 "Wortsman et al. 2023), ± SE over seeds; a diverged run counts at its loss at init. "
                 f"Collapsed: head-runs below {COLLAPSE_WORDS:g} effective words at some recorded step.")
    lines += reading(rows, unigram=result.get("unigram"), plateau=result.get("plateau", ()))
    return "\n".join(lines)
