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

__all__ = ["train_run", "mark_running"]


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
    stderr and in the record's notes. ``watch``: an ``attnscale.watch.Attached`` for the tiny LM's loop
    (``lm.train.train``'s); the actions its alerts took are in the record's results."""
    from attnscale.lm.checkpoint import run_config

    train = _trainer(model_cfg)
    if watch is not None and train.__module__ != "attnscale.lm.train":
        raise ConfigError(f"train_run's watch= follows the tiny LM's own loop, not {type(model_cfg).__name__}'s "
                          "Trainer; give that Trainer attnscale.watch.WatchCallback instead")
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
    record = rec.new("train", run_config(model_cfg, train_cfg, corpus), results, status=results["status"],
                     started=started, group=group, notes=results.get("notes", ()), device=results.get("device"))
    rec.write(run_dir, record)
    return rec.TrainRun.load(run_dir, record)
