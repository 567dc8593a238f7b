"""One function trains one run into its folder and returns its record: ``train_run``.

Every executor calls it (this process, local worker processes, Ray tasks): the
executor decides where a run trains, never how. The model config decides which trainer:
the tiny LM's own loop (``lm.train.train``) or, for an ``lm.hf_family.LlamaModelConfig``,
the Llama under transformers' Trainer (``lm.hf_family.train``); both return the same
results. It writes metrics.jsonl line by line as steps are recorded, the final
weights of a finished run (model.safetensors), and last the record, which commits
the run: a folder whose record is "done" holds everything the run made.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from attnscale.errors import ConfigError
from attnscale.runs import record as rec

__all__ = ["train_run", "mark_running", "record_config", "build_watch", "WATCH_KEYS"]

WATCH_KEYS = ("every", "probe", "qk_clip", "alerts")  # what a run's watch may say (``build_watch``)


def record_config(model_cfg, train_cfg, corpus, watch: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run is known by (``lm.checkpoint.run_config``), with its watch where it has one: a run without a
    watch keeps the config it always had, so its finished folders are found again."""
    from attnscale.lm.checkpoint import run_config

    config = run_config(model_cfg, train_cfg, corpus)
    return config if watch is None else {**config, "watch": watch}


def _action(spec: Any):
    """An alert's action from plain data: "warn" or "stop" as they are; {"clip_qk": {...}}, {"scale_lr": {...}}
    or {"skip_step": {...}} as ``watch.actions``' ``ClipQK``, ``ScaleLR`` and ``SkipStep``."""
    if spec in ("warn", "stop"):
        return spec
    if isinstance(spec, dict) and len(spec) == 1:
        (name, args), = spec.items()
        from attnscale.watch import actions

        kinds = {"clip_qk": actions.ClipQK, "scale_lr": actions.ScaleLR, "skip_step": actions.SkipStep}
        if name in kinds and isinstance(args, dict):
            return kinds[name](**args)
    raise ConfigError(f"a run's watch action must be 'warn', 'stop' or one of clip_qk, scale_lr, skip_step with its "
                      f"numbers, e.g. {{'clip_qk': {{'tau': 100.0}}}}; got {spec!r}")


def build_watch(spec: dict[str, Any] | None):
    """The ``watch.Attached`` a run's plain-data watch describes (None: none), made where the run trains.

    ``spec``: {"every": probe cadence, "probe": "records" (the run's records' own sequence, ``lm.train``) or
    None (the first batch), "qk_clip": tau or None, "alerts": [{"max_score": {"tau": ..., "action": ...}}]}
    (no "alerts": none; the watch's defaults are not taken, so that what acts is what the spec says)."""
    if spec is None:
        return None
    unknown = sorted(set(spec) - set(WATCH_KEYS))
    if unknown or spec.get("probe") not in (None, "records"):
        raise ConfigError(f"a run's watch takes {', '.join(WATCH_KEYS)} (probe: 'records' or None); got {spec!r}")
    from attnscale.watch import Attached, MaxScore

    alerts = []
    for alert in spec.get("alerts") or ():
        if not (isinstance(alert, dict) and list(alert) == ["max_score"]):
            raise ConfigError(f"a run's watch alerts are {{'max_score': {{'tau': ..., 'action': ...}}}}; got {alert!r}")
        args = dict(alert["max_score"])
        alerts.append(MaxScore(tau=float(args.pop("tau")), action=_action(args.pop("action", "warn")), **args))
    return Attached(every=int(spec.get("every", 10)), probe=spec.get("probe"), alerts=alerts,
                    qk_clip=spec.get("qk_clip"), probe_sequences=1)



def mark_running(run_dir: Path, config: dict[str, Any], group: str | None) -> None:
    """Clear what an interrupted attempt left and say, on disk, what this folder is for."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / rec.METRICS).unlink(missing_ok=True)
    (run_dir / rec.WEIGHTS).unlink(missing_ok=True)
    rec.write(run_dir, rec.new("train", config, None, status="running", group=group))


def _trainer(model_cfg) -> Callable:
    from attnscale.lm.hf_family import LlamaModelConfig

    if isinstance(model_cfg, LlamaModelConfig):
        from attnscale.lm.hf_family import train
    else:
        from attnscale.lm.train import train
    return train


def train_run(model_cfg, train_cfg, corpus, run_dir: Path, *, group: str | None = None,
              on_step: Callable[[int, int, dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, watch: Any = None) -> rec.TrainRun:
    """Train ``model_cfg`` on ``corpus`` with ``train_cfg`` into ``run_dir``; return the run as read back.

    Resumes from ``run_dir/checkpoint.pt`` when ``train_cfg.checkpoint_every`` saved
    one for this very config; a checkpoint that could not be used is said on
    stderr and in the record's notes. ``watch``: for the tiny LM's loop (``lm.train.train``'s), an
    ``attnscale.watch.Attached``, or the run's watch as plain data (``build_watch``), which its record's
    config then keeps; the actions its alerts took are in the record's results."""
    train = _trainer(model_cfg)
    if watch is not None and train.__module__ != "attnscale.lm.train":
        raise ConfigError(f"train_run's watch= follows the tiny LM's own loop, not {type(model_cfg).__name__}'s "
                          "Trainer; give that Trainer attnscale.watch.WatchCallback instead")
    spec = watch if isinstance(watch, dict) else None
    watch = build_watch(spec) if spec is not None else watch
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(run_dir / rec.METRICS, "w", encoding="utf-8") as metrics:  # afresh: a resumed run replays its lines

        def log(line: dict[str, Any]) -> None:
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()

        extra = {} if watch is None else {"watch": watch}
        results = train(model_cfg, train_cfg, corpus, log=log, checkpoint=run_dir / rec.CHECKPOINT,
                        weights=run_dir / rec.WEIGHTS, on_step=on_step, should_stop=should_stop, **extra)
    for note in results.get("notes", ()):
        print(f"attnscale: {run_dir.name}: {note}", file=sys.stderr, flush=True)
    record = rec.new("train", record_config(model_cfg, train_cfg, corpus, spec), results, status=results["status"],
                     started=started, group=group, notes=results.get("notes", ()), device=results.get("device"))
    rec.write(run_dir, record)
    return rec.TrainRun.load(run_dir, record)
