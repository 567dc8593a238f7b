"""Experiment 4 — where does "large" start? Held-out perplexity across head widths.

Trains the tiny model at each width × scheme × seed (× learning rate, when
given), same budget, and compares perplexity on the held-out split. The course:
no difference at width 32 (the run without the scale even slightly ahead),
about 2 points of perplexity at 128, 17 to 18 from 256 upwards.

The gap at a width is ppl(none) − ppl(inv_sqrt_d), averaged over seeds; seeds
are paired (the same seed gives both schemes the same batches), so its standard
error is that of the per-seed differences (``analysis.gaps.gap_table``, which
the report reads too, with the rule for where the gap starts). Any registered scheme can join the
sweep; the gap table compares two of them (``baseline``, ``reference``).

Runs go to ``out/<run_id>`` with record extra {"group": "sweep"}, resumed by
``attnscale.runs.runner``: an interrupted sweep, rerun, trains only what is missing.

Beside the runs, the floors a gap is read against (``floor``; the course's preset has it): the
corpus's unigram and bigram perplexity, counted (``out/floors.json``, ``analysis.floors``), and one
``uniform`` model (attention that learns nothing through its scores) of the same shape and budget,
at width 128 (``FLOOR_HEAD_DIM``; the narrowest width where the sweep has no 128), first seed. One
width is enough: with no scores, the width only sizes v, and 128 is where the course's gap is small.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from attnscale.runs import store
from attnscale.runs.record import Floors, TrainRun
from attnscale.core.scales import display_name
from attnscale.errors import ConfigError
from attnscale.terminal import table
from attnscale.experiments.dynamics import check_budget, model_config
from attnscale.experiments.training_config import TrainingConfig
from attnscale.lm.presets import budget, preset_name
from attnscale.runs.runner import CorpusSpec, RunSpec, execute
from attnscale.analysis.estimates import mean_se, plus_minus
from attnscale.analysis.gaps import (COURSE_GAPS, COURSE_PLATEAU, GAP_RULE, GAP_THRESHOLD_PPL, SHARE_MEANING, floor_ppl,
                                     gap_table, run_rows, value_shares)

__all__ = ["SweepConfig", "preset", "run", "run_records", "specs", "rows_from_records", "gap_table", "format_table",
           "GAP_THRESHOLD_PPL", "GAP_RULE", "FLOOR_HEAD_DIM", "FLOOR_SCALE", "floor_head_dim", "write_floors", "floors"]

FLOOR_HEAD_DIM = 128
FLOOR_SCALE = "uniform"


def floor_head_dim(head_dims: Sequence[int]) -> int:
    """The width the ``uniform`` floor trains at: ``FLOOR_HEAD_DIM`` where the sweep has it, else its narrowest."""
    return FLOOR_HEAD_DIM if FLOOR_HEAD_DIM in head_dims else min(head_dims)


@dataclass(frozen=True)
class SweepConfig(TrainingConfig):
    """Widths × schemes × seeds (× lrs). ``model`` holds ModelConfig fields other than
    vocab_size, head_dim and scale; ``train.seed`` and, with ``lrs``, ``train.lr`` are set per run.
    ``device``, when given, is where every run trains (it sets ``train.device``)."""

    head_dims: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    seeds: tuple[int, ...] = (0,)
    lrs: tuple[float, ...] | None = None
    floor: bool = False  # train the ``uniform`` floor beside the runs and count the corpus's floors

    def __post_init__(self):
        super().__post_init__()
        for name in ("head_dims", "scales", "seeds") + (("lrs",) if self.lrs is not None else ()):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{name} must be a non-empty list without repeats, got {values}")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in self.head_dims):
            raise ConfigError(f"head_dims must be positive integers, got {self.head_dims}")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds must be non-negative integers, got {self.seeds}")
        for lr in self.lrs or ():
            replace(self.train, lr=lr)  # TrainConfig says what a bad lr is
        for scale in self.scales:
            model_config(self.model, 1, self.head_dims[0], scale)
        check_budget(self.model, self.train, self.runs_per_head_dim())

    def runs_per_head_dim(self) -> dict[int, int]:
        runs = {w: len(self.scales) * len(self.seeds) * len(self.lrs or (None,)) for w in self.head_dims}
        if self.floor:
            runs[floor_head_dim(self.head_dims)] += 1
        return runs

    @property
    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(self.corpus, self.tokenizer)


def preset(quick: bool = False, corpus: str = "default", seed: int = 0, tokenizer: str | None = None,
           vocab_size: int | None = None, full: bool = False) -> SweepConfig:
    """The course's sweep: widths 32 … 1,024, none vs inv_sqrt_d, on ``lm.presets.budget``
    (so its widest pair is the dynamics pair) with the budget's seeds from ``seed`` on (one;
    ``full``: the "full" budget, several). ``quick`` keeps the course's ends and
    middle (32, 128, 1,024) on the "quick" budget: about a minute in all."""
    vocab = vocab_size if vocab_size is not None else CorpusSpec(corpus, tokenizer).load().vocab_size
    b = budget(preset_name(quick, full), vocab)
    head_dims = (32, 128, 1024) if quick else (32, 64, 128, 256, 512, 1024)
    return SweepConfig(corpus=corpus, tokenizer=tokenizer, head_dims=head_dims, seeds=tuple(range(seed, seed + b.seeds)),
                       model=b.model, train=b.train, floor=True)


def specs(cfg: SweepConfig, vocab_size: int, group: str = "sweep") -> list[RunSpec]:
    """One run per width × scheme × seed (× lr), narrow widths first."""
    check_budget(cfg.model, cfg.train, cfg.runs_per_head_dim(), vocab_size)
    out = []
    for lr in cfg.lrs or (None,):
        for head_dim in cfg.head_dims:
            for seed in cfg.seeds:
                for scale in cfg.scales:
                    train_cfg = replace(cfg.train, seed=seed, **({} if lr is None else {"lr": lr}),
                                        **({} if cfg.device is None else {"device": cfg.device}))
                    out.append(RunSpec(store.run_id(head_dim, scale, seed, lr), model_config(cfg.model, vocab_size, head_dim, scale),
                                       train_cfg, group))
    if cfg.floor and FLOOR_SCALE not in cfg.scales:
        w, lr = floor_head_dim(cfg.head_dims), (cfg.lrs or (None,))[0]
        train_cfg = replace(cfg.train, seed=cfg.seeds[0], **({} if lr is None else {"lr": lr}),
                            **({} if cfg.device is None else {"device": cfg.device}))
        out.append(RunSpec(store.run_id(w, FLOOR_SCALE, cfg.seeds[0], lr),
                           model_config(cfg.model, vocab_size, w, FLOOR_SCALE), train_cfg, group))
    return out


def write_floors(corpus, out: Path) -> Floors:
    """The corpus's counted floors (``analysis.floors``) in ``out/floors.json``, kept where those of the
    same corpus are there already."""
    from attnscale.analysis.floors import ngram_floors
    from attnscale.runs import record as rec

    try:
        old = rec.read_floors(out)
    except rec.RecordError:
        old = None  # damaged: counted again
    if old is not None and old.corpus == corpus.describe():
        return old
    floors = Floors(**ngram_floors(corpus.train, corpus.valid, corpus.vocab_size), corpus=corpus.describe())
    Path(out).mkdir(parents=True, exist_ok=True)
    rec.write_floors(out, floors)
    return floors


def floors(out: Path) -> Floors | None:
    """The counted floors a sweep wrote in ``out`` (None: a sweep written before, or without them)."""
    from attnscale.runs import record as rec

    return rec.read_floors(out)


def run_records(cfg: SweepConfig, out: Path, jobs: int = 1, progress: bool = True,
                group: str = "sweep", reuse: Sequence[Path] = (), executor: str = "local",
                ray_address: str | None = None, pace=None) -> list[TrainRun]:
    """Train every run not yet finished under ``out/<run_id>``; return every run as read back."""
    corpus = cfg.corpus_spec.load()
    runs = execute(specs(cfg, corpus.vocab_size, group), cfg.corpus_spec, Path(out), jobs=jobs,
                   progress=progress, corpus=corpus, reuse=reuse, executor=executor, ray_address=ray_address,
                   pace=pace)
    if cfg.floor:  # after the runs: a corpus or config the runner refuses leaves no record behind
        write_floors(corpus, out)
    return runs


def run(cfg: SweepConfig, out: Path, jobs: int = 1, progress: bool = True,
        reuse: Sequence[Path] = (), executor: str = "local", ray_address: str | None = None,
        pace=None) -> list[dict[str, Any]]:
    """Train every run not yet finished under ``out/<run_id>``; return one row per run.

    ``reuse``: folders whose finished runs of an identical config are copied, not
    retrained (``reproduce`` passes its dynamics folder: the presets make the
    dynamics pair the sweep's widest pair). ``executor``, ``ray_address``: where
    the runs train (``runs.runner.execute``)."""
    return rows_from_records(run_records(cfg, out, jobs, progress, reuse=reuse, executor=executor,
                                         ray_address=ray_address, pace=pace), varied_lr=cfg.lrs is not None)


def rows_from_records(runs: list[TrainRun], varied_lr: bool = False) -> list[dict[str, Any]]:
    """Rows {run_id, head_dim, scale, seed, lr, valid_ppl, status, diverged_at, train_seconds}
    (``analysis.gaps.run_rows``). ``lr`` is the run's learning rate when the sweep varied it, else None."""
    return run_rows(runs, varied_lr)


def _fmt_ppl(mean: float | None, se: float | None, diverged: int) -> str:
    if mean is None:
        return "diverged" if diverged else "-"
    text = plus_minus(mean, se, "{:.2f}", terminal=True)
    return text + (f" ({diverged} div)" if diverged else "")


def format_table(rows: list[dict[str, Any]], baseline: str = "none", reference: str = "inv_sqrt_d") -> str:
    """Held-out perplexity per width (columns: schemes, mean ± SE over seeds), the gap, where it starts."""
    scales = list(dict.fromkeys(r["scale"] for r in rows))
    gaps = gap_table(rows, baseline, reference)
    floor = floor_ppl(rows, FLOOR_SCALE)
    of_value = value_shares(gaps, floor)
    by_cell = {(g["lr"], g["head_dim"]): g for g in gaps["rows"]}
    lrs = list(dict.fromkeys(r["lr"] for r in rows))
    lines = []
    for lr in lrs:
        if lr is not None:
            lines.append(f"lr {lr:g}")
        cells_by_head_dim = []
        for head_dim in sorted({r["head_dim"] for r in rows if r["lr"] == lr}):
            cells = []
            for s in scales:
                mine = [r for r in rows if r["lr"] == lr and r["head_dim"] == head_dim and r["scale"] == s]
                ppls = [r["valid_ppl"] for r in mine if r["valid_ppl"] is not None]
                cells.append(_fmt_ppl(*mean_se(ppls), sum(r["status"] == "diverged" for r in mine)))
            g = by_cell.get((lr, head_dim))
            if g is None:
                gap = "-"
            elif g["diverged"]:
                gap = f"{g['diverged']} diverged"
            else:
                gap = (plus_minus(g["gap"], g["gap_se"], "{:+.2f}", terminal=True)
                       + (f" ({g['share']:.0%})" if g["share"] is not None else ""))
            v = of_value.get(head_dim) if lr == lrs[0] else None
            course = COURSE_GAPS.get(head_dim)
            cells_by_head_dim.append([head_dim, *cells, gap, "-" if v is None else f"{v:.2f}",
                                      "-" if course is None else f"{course / COURSE_PLATEAU:.2f}"])
        lines += table(("width", *map(display_name, scales), "gap (% of ref.)", "share of V", "course's"),
                       cells_by_head_dim, ">" * (len(scales) + 4))
        here = next((s for s in gaps["starts"] if s["lr"] == lr), {})
        start, maybe = here.get("head_dim"), here.get("head_dim_if_undecided")
        said = f"it starts at width {start}" if start is not None else "no width shows a gap"
        if maybe != start:  # some gap above the threshold is not beyond its noise
            said += f" (at width {maybe} if the gaps not yet beyond their noise are real)"
        base, ref = display_name(baseline), display_name(reference)
        lines.append(f"gap = ppl({base}) − ppl({ref}), in points and as a share of ppl({ref}); "
                     + said + f" ({GAP_RULE})")
    if floor is not None:
        lines.append(f"V = F − ppl({display_name(reference)}), F = {floor:.2f} (the trained {display_name(FLOOR_SCALE)} "
                     f"model); {SHARE_MEANING}; the course's: its gap / {COURSE_PLATEAU:g} (its plateau; its floor is not given)")
    return "\n".join(lines)
