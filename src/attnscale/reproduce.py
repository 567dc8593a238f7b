"""`attnscale reproduce`: every measurement of the chapter, in order, then the report.

Stages write into one folder (layout in ``runs.py``); a stage whose record is
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

__all__ = ["run", "stages"]

# the schemes stage with -j 2 on an idle 2-core machine, embedded corpus (--quick, default),
# from CPU time: 60 runs of 120 steps took 252 s of CPU in the named study
SCHEMES_ESTIMATE_S = {True: 15.0, False: 150.0}


@dataclass(frozen=True)
class Stage:
    name: str
    folder: str  # relative to the output folder
    estimate_s: float  # rough cost on a 2-core laptop, for the ETA
    config: object  # the experiment's config, compared with what is on disk
    runner: Callable[[object, Path], object]
    # one-record stages are skipped when their record exists; groups of runs
    # are always handed to the sweep runner, which skips each finished run itself
    group: bool = False


def stages(*, seed: int = 0, quick: bool = False, corpus: str = "default", jobs: int = 1,
           executor: str = "local", ray_address: str | None = None, device: str | None = None) -> list[Stage]:
    """The stages in order; ``device`` is where the training runs go (spread and fresh stay on the CPU)."""
    from attnscale.experiments import dynamics, fresh, schemes, spread, sweep

    from attnscale.lm.data import load_corpus

    pairs, sequences = (5000, 50) if quick else (20000, 200)
    vocab = load_corpus(corpus).vocab_size  # once: the budgets depend on it
    dyn = replace(dynamics.preset(quick=quick, corpus=corpus, seed=seed, vocab_size=vocab), device=device)
    swp = replace(sweep.preset(quick=quick, corpus=corpus, seed=seed, vocab_size=vocab), device=device)
    dyn_s, swp_s = _training_estimate(quick, vocab, jobs)
    return [
        Stage("spread of q·k vs width", "spread", 2, spread.SpreadConfig(pairs=pairs, seed=seed),
              lambda c, d: spread.run(c, out=d)),
        Stage("fresh head, unit-variance q and k", "fresh-unit", 3,
              fresh.FreshConfig(sequences=sequences, init="unit", seed=seed), lambda c, d: fresh.run(c, out=d)),
        Stage("fresh head, the model's own init", "fresh-model", 5,
              fresh.FreshConfig(sequences=sequences, init="model", seed=seed), lambda c, d: fresh.run(c, out=d)),
        Stage("training dynamics with and without the scale", "dynamics", dyn_s, dyn,
              lambda c, d: dynamics.run(c, d, jobs=jobs, executor=executor, ray_address=ray_address), group=True),
        Stage("width sweep: held-out perplexity", "sweep", swp_s, swp,
              # the widest pair of the sweep is the dynamics pair, same budget: copied, not retrained
              lambda c, d: sweep.run(c, d, jobs=jobs, reuse=[d.parent / "dynamics"], executor=executor,
                                     ray_address=ray_address), group=True),
        # beyond the course: every scheme over a learning-rate grid ("smoke" for --quick, else "quick")
        Stage("which scale? schemes × widths × learning rates", "schemes", SCHEMES_ESTIMATE_S[quick] * 2 / min(jobs, 2),
              replace(schemes.preset("smoke" if quick else "quick", corpus=corpus, seed=seed, vocab_size=vocab), device=device),
              lambda c, d: schemes.run(c, d, jobs=jobs, executor=executor, ray_address=ray_address), group=True),
    ]


def _training_estimate(quick: bool, vocab_size: int, jobs: int) -> tuple[float, float]:
    """Seconds for the dynamics pair and the rest of the sweep, for the stage ETA:
    what they took on a 2-core laptop with -j 2 (char-level embedded corpus:
    100 s and 118 s; word-level WikiText-2: 258 s and 707 s), scaled by the jobs.
    The sweep runner then prints an ETA measured from the steps it has done."""
    from attnscale.lm.presets import LARGE_VOCAB

    if quick:
        dyn, swp = 10.0, 10.0
    elif vocab_size > LARGE_VOCAB:
        dyn, swp = 258.0, 707.0
    else:
        dyn, swp = 100.0, 118.0
    slower = 2 / min(jobs, 2)
    return dyn * slower, swp * slower


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


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(out: Path, *, seed: int = 0, quick: bool = False, corpus: str = "default", jobs: int = 1,
        executor: str = "local", ray_address: str | None = None, device: str | None = None) -> Path:
    """Run every stage not yet on disk, then build the report; returns the report's HTML path.

    ``executor="ray"``: the training stages run as Ray tasks, in one Ray session
    (a local instance, or the cluster at ``ray_address``) opened for the first of them."""
    out = Path(out)
    todo = stages(seed=seed, quick=quick, corpus=corpus, jobs=jobs, executor=executor, ray_address=ray_address,
                  device=device)
    started = time.time()
    left = sum(s.estimate_s for s in todo)
    with contextlib.ExitStack() as ray_session:
        opened = False
        for i, stage in enumerate(todo, 1):
            folder = out / stage.folder
            eta = f"~{left / 60:.0f} min left" if left >= 90 else f"~{left:.0f} s left"
            if _on_disk(stage, folder):
                _say(f"[{i}/{len(todo)}] {stage.name}: already on disk, kept")
            else:
                _say(f"[{i}/{len(todo)}] {stage.name} ({eta}) ...")
                if stage.group and executor == "ray" and not opened:
                    from attnscale.runs import ray_executor
                    from attnscale.runs.runner import cores

                    ray_session.enter_context(ray_executor.session(ray_address, cores()))
                    opened = True
                t = time.time()
                stage.runner(stage.config, folder)
                _say(f"[{i}/{len(todo)}] {stage.name}: done in {time.time() - t:.1f} s")
            left -= stage.estimate_s
    from attnscale import report

    paths = report.build(out, out / "report")
    _say(f"reproduce finished in {time.time() - started:.0f} s")
    print(f"report: {paths['html']}")
    print(f"markdown: {paths['markdown']}")
    return paths["html"]
