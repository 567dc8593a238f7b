"""The run store: one directory per run, and the rules for resuming a folder.

What a run directory holds, and the record's schema, are in ``runs.record``.

Resume (``run_state``, used by ``runs.runner``): a record with status "done" or
"diverged" and the same config is final and never redone; no record, or one left
"running" (written before training starts) or "stopped", means the run is
trained again from its checkpoint.pt or from step 0, with its metrics.jsonl
started afresh; a folder holding another config or experiment is refused with a
ConfigError. A record that cannot be read is "damaged": ``set_aside`` renames it,
and the metrics and weights beside it, to ``NAME.damaged-<n>`` (a checkpoint too,
where it is not this run's), says so on stderr, and the run is trained again;
nothing a run made is deleted because its record was. Thread count, device, attention path and checkpoint interval do not
make another config, nor does the path a corpus was read from (its sha256 does).

Layout of an output folder (``attnscale reproduce --out OUT``):
    OUT/spread/                    experiment "spread"
    OUT/fresh-unit/, fresh-model/  experiment "fresh" (config.init "unit" / "model")
    OUT/dynamics/<run_id>/         experiment "train", group "dynamics"
    OUT/sweep/<run_id>/            experiment "train", group "sweep"
    OUT/report/                    index.html, report.md and PNGs
run_id = f"d{head_dim}-{scale}-s{seed}" (plus a suffix such as "-lr3e-3" when a sweep varies more).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.study_axes import lr_text
from attnscale.runs import record as rec

__all__ = ["run_id", "comparable_config", "run_state", "set_aside"]  # comparable_config: lm.train's, re-exported


# ---- resume ----------------------------------------------------------------------


def run_id(head_dim: int, scale: str, seed: int, lr: float | None = None) -> str:
    """``d{head_dim}-{scale}-s{seed}``, plus ``-lr3e-3`` when a sweep varies the learning rate."""
    base = f"d{head_dim}-{scale}-s{seed}"
    return base if lr is None else f"{base}-lr{lr_text(lr)}"


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix[:-1] or 'config'} {a!r} on disk, {b!r} asked"]


def run_state(run_dir: Path, config: Any, experiment: str = "train", group: str | None = None) -> str:
    """What to do with ``run_dir`` for a run of ``config``.

    "finished": a record with status done or diverged and the same config (keep it);
    "restart": nothing usable yet (no record, a record left "running" or "stopped"
    by an interrupted run): train from scratch, the log afresh; "damaged": a record
    that cannot be read, which ``set_aside`` moves out of the way before the run is
    trained again (this function changes nothing on disk: ``run_dir`` may be another
    folder's, read for reuse); raises ``ConfigError`` when the folder holds a run of another config or
    experiment, or (where ``group`` is given) a run another command trained (another group: a record written
    before groups, with none, is taken as this one's), so two experiments never mix in one folder."""
    if not (Path(run_dir) / rec.RECORD).exists():
        return "restart"
    try:
        record = rec.read(run_dir)
    except rec.NewerRecordError:
        raise  # a newer attnscale's run: never overwrite it
    except rec.RecordError:
        return "damaged"  # records are written atomically: only a foreign hand, or a failing disk, leaves half of one
    if record.experiment != experiment:
        raise ConfigError(f"{run_dir} holds a {record.experiment!r} run, not {experiment!r}; use another --out")
    if group is not None and record.group not in (None, group):
        raise ConfigError(f"{run_dir} holds a run of {record.group!r}, not of {group!r}: another command trained it, "
                          "and this one would take it for its own or train over it; use another --out")
    diff = _differences(comparable_config(record.config), comparable_config(config))
    if diff:
        raise ConfigError(
            f"{run_dir} holds a run with another config ({'; '.join(diff[:3])}); "
            "use another --out, or delete that folder to retrain it"
        )
    return "finished" if record.finished_ok else "restart"


def set_aside(run_dir: Path, config: Any) -> list[Path]:
    """Rename ``run_dir``'s damaged record, with its metrics and weights (and a checkpoint that is not of
    ``config``, which training would otherwise overwrite), to ``NAME.damaged-<n>``, n the first number no such
    file has; say so on stderr and return the new paths. The record goes last: until then the folder still
    reads as damaged, so an interrupted set-aside is finished by the next resume."""
    from attnscale.lm.checkpoint import Checkpoint

    run_dir = Path(run_dir)
    try:
        rec.read(run_dir)
    except rec.NewerRecordError:
        raise  # a newer attnscale's run: left as it is
    except rec.RecordError as e:
        why = str(e).split("; ")[0]
    else:
        return []  # a record that reads is never moved
    names = [rec.METRICS, rec.WEIGHTS]
    if (run_dir / rec.CHECKPOINT).exists() and Checkpoint(run_dir / rec.CHECKPOINT, config).load()[0] is None:
        names.append(rec.CHECKPOINT)  # this run's own checkpoint stays: training resumes from it
    names.append(rec.RECORD)
    n = 1
    while any((run_dir / f"{name}.damaged-{n}").exists() for name in names):
        n += 1
    moved = []
    for name in names:
        if (run_dir / name).exists():
            moved.append((run_dir / name).rename(run_dir / f"{name}.damaged-{n}"))
    print(f"attnscale: {why}; set aside as {', '.join(p.name for p in moved)} in {run_dir}; "
          "this run is trained again", file=sys.stderr)  # a line: stderr writes it out at its end
    return moved
