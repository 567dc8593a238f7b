"""Progress of a set of training runs: runs done / total, each active run's step, time left.

On a terminal: a live ``rich`` display (one bar for the whole set, one per
active run). Elsewhere (CI logs, pipes): one plain line when a run starts and
one when it ends, and about once a minute a line with each active run's step and
the time left, never a carriage-return animation. ``progress=False``: silent.
The time left is the work left over the rate measured since this process started
(runs finished earlier do not count). Work is counted in arithmetic operations
where the caller gives each run's ``weights`` (``runs.pace``: a step at d=1,024
is worth about ten at d=32), else in steps. Runs copied from another folder
rather than trained are named as copies, with the folder they come from. Given
the ``runs.pace.Pace`` the weights came from, each run that ends tells it how
long it took against its estimate (``Pace.observe``), so the estimates made
after it (the next stage's) follow this machine as it is now.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["make_progress", "Silent", "Plain", "Live"]


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _outcome(summary: dict[str, Any]) -> str:
    ppl = summary.get("valid_ppl")
    text = summary.get("status") or "?"
    if ppl is not None:
        text += f", valid ppl {ppl:.2f}"
    if summary.get("duration_s") is not None:
        text += f" ({_duration(summary['duration_s'])})"
    return text


class Silent:
    """The interface, doing nothing: start, step, finish, close."""

    def __init__(self, *, total_runs: int, total_steps: int, done_runs: int, done_steps: int, out: Path,
                 weights: dict[str, float] | None = None, total_work: float | None = None,
                 done_work: float | None = None, copied: dict[str, Path] | None = None, pace=None,
                 clock=time.monotonic):
        self.total_runs, self.total_steps = total_runs, total_steps
        self.done_runs, self.done_steps = done_runs, done_steps
        self.out = out
        self._weights = weights or {}  # run -> work of one of its steps; 1 (a step) where not given
        self.total_work = total_steps if total_work is None else total_work
        self.done_work = done_steps if done_work is None else done_work
        self.copied = copied or {}  # run -> the folder it was copied from (counted in done_runs)
        self._steps: dict[str, int] = {}  # active run -> steps reached
        self._totals: dict[str, int] = {}  # active run -> steps planned
        self._trained = 0.0  # work trained by this process
        self._pace = pace  # told each run's time against its estimate (weights are then its step_seconds)
        self._clock = clock
        self._started: dict[str, float] = {}  # active run -> when it started
        self._first: dict[str, int] = {}  # active run -> the first step it reported (past a checkpoint's)
        self._t0 = clock()

    def start(self, run_id: str, steps: int) -> None:
        self._steps[run_id] = 0
        self._totals[run_id] = steps
        self._started[run_id] = self._clock()

    def resuming(self, run_id: str, step: int) -> str | None:
        """At a run's first report past step 1, the line that says from which step of its checkpoint it went on;
        else None. Said once, with the first step trained after it."""
        if run_id in self._first or step <= 1:
            return None
        return f"{run_id}: resuming from step {step - 1:,} of {self._totals.get(run_id, step):,} (its checkpoint)"

    def step(self, run_id: str, step: int, loss: float | None = None) -> int:
        """Record that ``run_id`` reached ``step``; return the steps gained since its last report. A run's first
        report past step 1 went on from its checkpoint: the steps before it are work done earlier (``done_work``),
        not trained now, so the pace (and the time left) reads the steps this process trained."""
        if run_id not in self._first and step > 1:
            already = max(0, step - 1 - self._steps.get(run_id, 0))
            self.done_steps += already
            self.done_work += already * self._weights.get(run_id, 1.0)
            self._steps[run_id] = max(step - 1, self._steps.get(run_id, 0))
        gained = max(0, step - self._steps.get(run_id, 0))
        self._first.setdefault(run_id, step)
        self._steps[run_id] = max(step, self._steps.get(run_id, 0))
        self._trained += gained * self._weights.get(run_id, 1.0)
        return gained

    def finish(self, run_id: str, summary: dict[str, Any]) -> int:
        """Count ``run_id`` as finished; return the planned steps it skipped (a diverged run ends early)."""
        started, first = self._started.pop(run_id, None), self._first.pop(run_id, None)
        if self._pace is not None and started is not None and first is not None:
            trained = self._steps.get(run_id, 0) - first + 1
            self._pace.observe(trained * self._weights.get(run_id, 0.0), self._clock() - started)
        skipped = max(0, self._totals.pop(run_id, 0) - self._steps.pop(run_id, 0))
        self.done_steps += skipped
        self.done_work += skipped * self._weights.get(run_id, 1.0)
        self.done_runs += 1
        return skipped

    def seconds_left(self) -> float | None:
        elapsed = self._clock() - self._t0
        if self._trained == 0 or elapsed <= 0:
            return None
        remaining = self.total_work - self.done_work - self._trained
        return max(0.0, remaining) / (self._trained / elapsed)

    def _kept_lines(self) -> list[str]:
        """What is not trained: copies (and the stage folder they come from), and runs finished earlier."""
        lines = []
        by_source: dict[Path, int] = {}
        for source in self.copied.values():
            by_source[Path(source)] = by_source.get(Path(source), 0) + 1
        for source, n in by_source.items():
            lines.append(f"{n} of {self.total_runs} run{'s are copies' if n != 1 else ' is a copy'} of "
                         f"{'runs' if n != 1 else 'a run'} the {source.name} stage trained ({source}): same config, "
                         "not trained again")
        kept = self.done_runs - len(self.copied)
        if kept:
            lines.append(f"{kept} of {self.total_runs} runs already finished in {self.out}; they are kept")
        return lines

    def close(self) -> None:
        pass


class Plain(Silent):
    """One line per event on stderr, for logs; while runs train, a line about every ``heartbeat_s``."""

    heartbeat_s = 60.0  # a log that says nothing for minutes looks like a hang

    def __init__(self, **kw):
        super().__init__(**kw)
        self._last_said = self._clock()
        for line in self._kept_lines():
            self._say(line)

    def _say(self, text: str) -> None:
        self._last_said = self._clock()
        print(f"attnscale: {text}", file=sys.stderr, flush=True)

    def step(self, run_id, step, loss=None):
        if (line := self.resuming(run_id, step)) is not None:
            self._say(line)
        gained = super().step(run_id, step, loss)
        if self._clock() - self._last_said >= self.heartbeat_s:
            left = self.seconds_left()
            eta = f"; about {_duration(left)} left" if left is not None else ""
            active = ", ".join(f"{r} step {s}/{self._totals.get(r, '?')}" for r, s in self._steps.items())
            self._say(f"[{self.done_runs}/{self.total_runs}] {active}{eta}")
        return gained

    def start(self, run_id, steps):
        super().start(run_id, steps)
        self._say(f"{run_id}: training {steps} steps")

    def finish(self, run_id, summary):
        super().finish(run_id, summary)
        left = self.seconds_left()
        eta = f"; about {_duration(left)} left" if left is not None and self.done_runs < self.total_runs else ""
        self._say(f"[{self.done_runs}/{self.total_runs}] {run_id}: {_outcome(summary)}{eta}")


class Live(Silent):
    """A live ``rich`` display on a terminal."""

    def __init__(self, **kw):
        super().__init__(**kw)
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[steps]}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self._console,
        )
        self._tasks: dict[str, Any] = {}
        # the whole set's bar counts work, as seconds_left does, so its eta agrees with the plain lines'
        self._all = self._bar.add_task(self._runs_text(), total=self.total_work, completed=self.done_work, info="",
                                       steps="")
        self._bar.start()
        for line in self._kept_lines():
            self._console.print(line)

    def _runs_text(self) -> str:
        return f"runs {self.done_runs}/{self.total_runs}"

    def start(self, run_id, steps):
        super().start(run_id, steps)
        self._tasks[run_id] = self._bar.add_task(f"  {run_id}", total=steps, info="", steps=f"{0:>5}/{steps:<5} steps")

    def step(self, run_id, step, loss=None):
        if (line := self.resuming(run_id, step)) is not None:
            self._console.print(line)
        done = self.done_work
        gained = super().step(run_id, step, loss)
        info = f"loss {loss:.3f}" if loss is not None else ""
        if run_id in self._tasks:
            self._bar.update(self._tasks[run_id], completed=step, info=info,
                             steps=f"{step:>5}/{self._totals.get(run_id, step):<5} steps")
        self._bar.advance(self._all, gained * self._weights.get(run_id, 1.0) + self.done_work - done)  # and a checkpoint's
        return gained

    def finish(self, run_id, summary):
        skipped = super().finish(run_id, summary)
        task = self._tasks.pop(run_id, None)
        if task is not None:
            self._bar.remove_task(task)
        self._bar.update(self._all, advance=skipped * self._weights.get(run_id, 1.0), description=self._runs_text())
        self._console.print(f"{run_id}: {_outcome(summary)}")

    def close(self):
        self._bar.stop()


def make_progress(enabled: bool, *, total_runs: int, total_steps: int, done_runs: int, done_steps: int, out: Path,
                  **work):
    """Live on a terminal, plain lines elsewhere, silent when not ``enabled``; ``work``: the
    optional ``weights``, ``total_work``, ``done_work``, ``copied`` and ``pace`` of ``Silent``."""
    kw = dict(total_runs=total_runs, total_steps=total_steps, done_runs=done_runs, done_steps=done_steps, out=out,
              **work)
    if not enabled:
        return Silent(**kw)
    if sys.stderr.isatty():
        try:
            import rich  # noqa: F401  (the extra attnscale[train]; without it, plain lines)
        except ImportError:
            return Plain(**kw)
        return Live(**kw)
    return Plain(**kw)
