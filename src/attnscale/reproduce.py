"""`attnscale reproduce`: every measurement of the chapter, in order, then the report.

Stages write into one folder (layout and schema in ``runs.record``); a stage whose record is
already there is not run again, so an interrupted reproduce picks up where it
stopped and the report can always be rebuilt from what is on disk.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from attnscale.errors import ConfigError
from attnscale.files import to_jsonable
from attnscale.runs import record as rec
from attnscale.runs.pace import Pace
from attnscale.terminal import table

__all__ = ["run", "scoreboard", "stages", "end_state"]

@dataclass(frozen=True)
class Stage:
    name: str
    folder: str  # relative to the output folder
    estimate_s: float  # a stage that trains nothing: its few seconds; training stages: work / pace
    config: object  # the experiment's config, compared with what is on disk
    runner: Callable[[object, Path], object]
    # one-record stages are skipped when their record exists; groups of runs
    # are always handed to the sweep runner, which skips each finished run itself
    group: bool = False
    runs: tuple = ()  # a group's runs that no earlier stage trains: what its estimate counts
    workers: int = 1  # processes that train its runs side by side


def _pending(stage: Stage, folder: Path) -> list:
    """The runs of a training stage still to train: runs finished under ``folder`` cost nothing."""
    return [s for s in stage.runs if not _finished(folder / s.run_id)]


def _left_s(stage: Stage, folder: Path, pace: Pace) -> float:
    """The seconds ``stage`` has left: its pending runs at this machine's measured ``pace``."""
    if not stage.group:
        return 0.0 if _on_disk(stage, folder) else stage.estimate_s
    return pace.seconds(_pending(stage, folder), stage.workers)


def measure_pace(todo: list[Stage], out: Path, corpus: str, jobs: int) -> tuple[Pace, str]:
    """This machine's training rate, timed on a few steps of the costliest run still to train
    (its device, precision and thread count), and a line that says what was timed."""
    from attnscale.lm.data import load_corpus
    from attnscale.runs import pace
    from attnscale.runs.runner import cores

    pending = [s for st in todo if st.group for s in _pending(st, out / st.folder)]
    if not pending:
        return Pace(0.0, 0.0), "nothing left to train"
    workers = max((st.workers for st in todo if st.group), default=1)
    measured = pace.measure(pending, load_corpus(corpus), threads=max(1, cores() // workers))
    return measured, (f"{pace.TIMED_STEPS} steps of {' and of '.join(measured.timed)} timed here: "
                      f"{measured.step_s * 1e3:.0f} ms a step plus {measured.op_s * 1e12:.0f} ms per 10^9 operations")


def _finished(run_dir: Path) -> bool:
    try:
        return (run_dir / rec.RECORD).exists() and rec.read(run_dir).status in rec.FINISHED
    except rec.RecordError:
        return False


def stages(*, seed: int = 0, preset: str = "default", corpus: str = "default", jobs: int = 1,
           executor: str = "local", ray_address: str | None = None, device: str | None = None,
           dtype: str | None = None) -> list[Stage]:
    """The stages in order; ``preset``: "quick", "default" or "full" (``lm.presets``);
    ``device`` is where the training runs go (spread and fresh stay on the CPU); ``dtype``,
    when given, the precision they train in instead of the preset's "auto".

    "full" trains the dynamics pair once per seed of the sweep (so the dynamics claims read
    a mean over seeds); runs that two stages share (the sweep's widest pairs) are trained
    once and copied. The setup study is its own command (``attnscale study``): its runs
    put into the same folder (``--out DIR/study``) join the report."""
    from attnscale.experiments import dynamics, fresh, schemes, spread, sweep
    from attnscale.lm.data import load_corpus
    from attnscale.lm.presets import PRESETS, budget
    from attnscale.runs.runner import cores

    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    quick, full = preset == "quick", preset == "full"
    pairs, sequences = (5000, 50) if quick else (20000, 200)
    vocab = load_corpus(corpus).vocab_size  # once: the budgets depend on it
    seeds = range(seed, seed + budget(preset, vocab).seeds)

    def on(cfg):
        """``cfg`` where the runs train: ``device``, and ``dtype`` where one is asked for."""
        return replace(cfg, device=device, **({} if dtype is None else {"train": replace(cfg.train, dtype=dtype)}))

    dyns = [on(dynamics.preset(quick=quick, full=full, corpus=corpus, seed=s, vocab_size=vocab)) for s in seeds]
    swp = on(sweep.preset(quick=quick, full=full, corpus=corpus, seed=seed, vocab_size=vocab))
    sch = on(schemes.preset("smoke" if quick else "quick", corpus=corpus, seed=seed, vocab_size=vocab))
    counted: set[str] = set()
    workers = min(jobs, cores())

    def new(specs) -> tuple:
        """The runs no earlier stage trains (copies cost nothing)."""
        fresh = tuple(s for s in specs if repr((s.run_id, s.model, s.train)) not in counted)
        counted.update(repr((s.run_id, s.model, s.train)) for s in fresh)
        return fresh

    def group(name: str, folder: str, specs, cfg, runner) -> Stage:
        runs = new(specs)
        return Stage(name, folder, 0.0, cfg, runner, group=True, runs=runs, workers=max(1, min(workers, len(runs))))

    def dyn_stage(cfg, label: str) -> Stage:
        return group(f"training dynamics with and without the scale{label}", "dynamics", dynamics.specs(cfg, vocab),
                     cfg, lambda c, d, pace=None: dynamics.run(c, d, jobs=jobs, executor=executor,
                                                               ray_address=ray_address, pace=pace))

    out = [
        Stage("spread of q·k vs width", "spread", 2, spread.SpreadConfig(pairs=pairs, seed=seed),
              lambda c, d: spread.run(c, out=d)),
        Stage("fresh head, unit-variance q and k", "fresh-unit", 3,
              fresh.FreshConfig(sequences=sequences, init="unit", seed=seed), lambda c, d: fresh.run(c, out=d)),
        Stage("fresh head, the model's own init", "fresh-model", 5,
              fresh.FreshConfig(sequences=sequences, init="model", seed=seed), lambda c, d: fresh.run(c, out=d)),
        *(dyn_stage(c, f" (seed {c.seed})" if len(dyns) > 1 else "") for c in dyns),
        group("width sweep: held-out perplexity", "sweep", sweep.specs(swp, vocab), swp,
              # the widest pairs of the sweep are the dynamics pairs, same budget: copied, not retrained
              lambda c, d, pace=None: sweep.run(c, d, jobs=jobs, reuse=[d.parent / "dynamics"], executor=executor,
                                                ray_address=ray_address, pace=pace)),
        # beyond the course: every scheme over a learning-rate grid ("smoke" for --quick, else "quick")
        group("which scale? schemes × widths × learning rates", "schemes", schemes.specs(sch, vocab), sch,
              lambda c, d, pace=None: schemes.run(c, d, jobs=jobs, executor=executor, ray_address=ray_address,
                                                  pace=pace)),
    ]
    return out


def _on_disk(stage: Stage, folder: Path) -> bool:
    """True when ``folder`` already holds this stage's record; a record made with
    other settings is an error, never silently mixed into the report."""
    if stage.group or not (folder / rec.RECORD).exists():
        return False
    stored = rec.read(folder).config
    if stored != to_jsonable(stage.config):
        raise ConfigError(
            f"{folder} holds a {stage.folder} run made with other settings; "
            "use another --out, or delete that folder to redo it"
        )
    return True


def _named(claims) -> list[str]:
    """Each claim in words that stand alone: the course lists some as "… grows to over 5,000",
    continuing the claim before; those borrow its subject (the words before its colon)."""
    names, subject, experiment = [], "", None
    for v in claims:
        if v.experiment != experiment:
            subject, experiment = "", v.experiment
        if ":" in v.claim and not v.claim.startswith("…"):
            subject = v.claim.split(":", 1)[0]
        if v.claim.startswith("…"):
            rest = v.claim.lstrip("… ").removeprefix("and ")
            names.append(f"{subject or v.experiment}: {rest}")
        else:
            names.append(v.claim)
    return names


def scoreboard(out: Path) -> list[str]:
    """The verdicts on the course's claims as the report judges them (``report.assemble.verdicts``):
    one line of counts, then one line for each claim that does not agree."""
    from collections import Counter

    from attnscale.report import course
    from attnscale.report.assemble import load_runs, verdicts

    judged = verdicts(load_runs(Path(out)))
    counts = Counter(v.verdict for v in judged)
    tally = ", ".join(f"{counts[k]} {w}" for k, w in course.SAID.items()
                      if counts[k] or k not in (course.NOT_RUN, course.INCONCLUSIVE))
    lines = [f"scoreboard: {tally} (of the course's {len(judged)} claims)"]
    lines += ["  " + line for line in table(("", "claim"), ([v.verdict, f"{name}: course {v.course}, here {v.ours}"]
                                                        for v, name in zip(judged, _named(judged))
                                                        if v.verdict != course.AGREES), "<<")[1:]]
    return lines


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(out: Path, *, seed: int = 0, preset: str = "default", corpus: str = "default", jobs: int = 1,
        executor: str = "local", ray_address: str | None = None, device: str | None = None,
        dtype: str | None = None) -> Path:
    """Run every stage not yet on disk, then build the report; returns the report's HTML path.

    Before the first stage it times a few training steps here (``measure_pace``) and
    prints the estimated time of what is left; before each stage, that stage's time
    and the time left, at the pace measured so far (the timed steps, then every run
    that ended since, ``runs.pace.Pace.observe``); after it, the time it took beside the estimate.

    ``executor="ray"``: the training stages run as Ray tasks, in one Ray session
    (a local instance, or the cluster at ``ray_address``) opened for the first of them."""
    from attnscale.report.assemble import check_out as check_report
    from attnscale.runs.writers import check_runs_folder

    out = Path(out)
    check_runs_folder(out)  # before any stage: its folders of runs go under it, never beside a record
    check_report(out / "report")  # the report is written last, and over nothing another command wrote
    todo = stages(seed=seed, preset=preset, corpus=corpus, jobs=jobs, executor=executor, ray_address=ray_address,
                  device=device, dtype=dtype)
    started = time.time()
    pace, timed = measure_pace(todo, out, corpus, jobs)
    left = sum(_left_s(s, out / s.folder, pace) for s in todo)
    _say(f"attnscale reproduce, {preset} preset: {len(todo)} stage{'s' if len(todo) != 1 else ''}, about "
         f"{_minutes(left)} of work left with {jobs} job{'s' if jobs != 1 else ''} at the pace of this machine "
         f"({timed}; finished runs are kept)")
    with contextlib.ExitStack() as ray_session:
        opened = False
        for i, stage in enumerate(todo, 1):
            folder = out / stage.folder
            if _on_disk(stage, folder):
                _say(f"[{i}/{len(todo)}] {stage.name}: already on disk, kept")
                continue
            mine = _left_s(stage, folder, pace)
            left = sum(_left_s(s, out / s.folder, pace) for s in todo[i - 1:])
            _say(f"[{i}/{len(todo)}] {stage.name} (about {_minutes(mine)}; {_minutes(left)} left in all) ...")
            if stage.group and executor == "ray" and not opened:
                from attnscale.runs import ray_executor
                from attnscale.runs.runner import cores

                ray_session.enter_context(ray_executor.session(ray_address, cores()))
                opened = True
            t = time.time()
            # a training stage's runs weigh their steps by the same pace as this stage's estimate
            stage.runner(stage.config, folder, pace=pace) if stage.group else stage.runner(stage.config, folder)
            took = time.time() - t  # each run that ended in it has corrected ``pace`` (runs.progress)
            _say(f"[{i}/{len(todo)}] {stage.name}: done in {took:.1f} s (estimated {mine:.0f} s)")
    from attnscale import report

    paths = report.build(out, out / "report")
    _say(f"reproduce finished in {time.time() - started:.0f} s")
    if preset == "full" and not (out / "study").exists():
        _say(f"the setup study (how the end of training depends on lr, schedule, weight decay, init, norm and "
             f"length): attnscale study --quick --out {out / 'study'} --reuse {out / 'dynamics'}, "
             f"then attnscale report {out}")
    print("\n".join(scoreboard(out)))
    print(f"report: {paths['html']}")
    print(f"markdown: {paths['markdown']}")
    return paths["html"]


def end_state(out: Path, *, jobs: int = 2, corpus: str = "default", device: str | None = None,
              dtype: str | None = None, executor: str = "local", ray_address: str | None = None) -> list[str]:
    """The long run designed to reach the course's end of training (``experiments.end_state``), trained
    where not on disk (a killed run resumes), then judged by the rule written before it ran
    (``analysis.end_state``); returns the verdict's lines, which it prints. ``dtype``, when given, the
    precision the runs train in instead of the budget's; ``executor``: as ``run``'s."""
    from attnscale.analysis import end_state as rule
    from attnscale.experiments import end_state as experiment

    cfg = experiment.EndStateConfig(corpus=corpus, device=device)
    cfg = cfg if dtype is None else replace(cfg, train=replace(cfg.train, dtype=dtype))
    started = time.time()
    runs = experiment.run_records(cfg, Path(out), jobs=jobs, executor=executor, ray_address=ray_address)
    lines = rule.verdict_lines(rule.judge([rule.summary(r) for r in runs]))
    _say(f"end state: {time.time() - started:.0f} s")
    print("\n".join(lines))
    return lines
