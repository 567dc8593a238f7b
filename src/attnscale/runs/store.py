"""The run store: one self-describing directory per run.

A run directory holds
    record.json     experiment, config, seed, environment, status, results (written atomically)
    metrics.jsonl   optional: one JSON object per recorded step (one line at a time, flushed)
    *.png           optional plots

Reports are built only from these files, never from memory.

Resume (``run_state``, used by ``attnscale.runs.runner``): a record with status
"done" or "diverged" and the same config is final and never redone; no record,
or one left "running" (written before training starts) or "stopped", means the
run is trained again from step 0 (or from train's checkpoint.pt) with its
metrics.jsonl started afresh; a folder holding another config or experiment is
refused with a ConfigError. Thread count, checkpoint interval, device and
attention path do not make another config, nor does the path a corpus was read from (its sha256 does).

Layout of an output folder (``attnscale reproduce --out OUT``):
    OUT/spread/                    experiment "spread"
    OUT/fresh-unit/, fresh-model/  experiment "fresh" (config.init "unit" / "model")
    OUT/dynamics/<run_id>/         experiment "train", extra {"group": "dynamics"}
    OUT/sweep/<run_id>/            experiment "train", extra {"group": "sweep"}
    OUT/report/                    index.html, report.md and PNGs
run_id = f"d{head_dim}-{scale}-s{seed}" (plus a suffix such as "-lr3e-3" when a sweep varies more).

Schema of ``results`` per experiment (the contract the report reads):
- spread: list of rows {width, scale, factor, pairs, raw_spread, scaled_spread, sqrt_d, raw_spread_se}.
- fresh: {"rows": [{width, scale, init, words, sequences, effective_words_median,
  effective_words_p10, effective_words_p90, effective_words_mean, max_weight_mean,
  frozen_fraction, frozen_threshold, push_median, push_mean, example (str),
  example_row (list of floats)}], "illustration": {scores, multipliers, weights, effective_words}}.
- train (written by ``train.train``): config = {"model": ModelConfig, "train": TrainConfig,
  "corpus": Corpus.describe()}; status "done" | "diverged" | "stopped" | "running";
  results = {status, steps_done, diverged_at (step or null), final_train_loss,
  valid_loss, perplexity (null if diverged), eval_tokens, d_k, scale, init, params,
  tokens_per_s, dtype, attention (the path of non-recording steps), device
  (``core.device.describe_device``: type, index, name, cuda_runtime, driver, dtype,
  threads, torch; on CUDA also capability, memory_gb, cudnn),
  "start": MEANS, "end": MEANS, "history": [LINE, ...]}, where
  MEANS (``train.summarize``) averages each diagnostic over layers and heads and
  LINE is one recorded step, as in metrics.jsonl.
  metrics.jsonl: one LINE per recorded step (step 0 is before any update):
  {"step", "loss", "lr", "elapsed_s", and per diagnostic of
  ``diagnostics.head_summary`` (spread, max_score, effective_words,
  frozen_fraction, push, max_weight) a [layer][head] list}. Non-finite numbers are null.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError
from attnscale.files import atomic_write_bytes, atomic_write_json, to_jsonable

__all__ = [
    "atomic_write_json",
    "environment",
    "write_record",
    "read_record",
    "find_records",
    "to_jsonable",
    "FINISHED",
    "run_id",
    "comparable_config",
    "run_state",
]

RECORD = "record.json"
METRICS = "metrics.jsonl"
# A run in one of these states is never trained again; "running" and "stopped" are redone.
FINISHED = ("done", "diverged")


def _git_hash() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Versions, git hash and hardware, for the record."""
    import numpy
    import torch

    import attnscale

    return {
        "attnscale": attnscale.__version__,
        "git": _git_hash(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_record(
    run_dir: Path,
    experiment: str,
    config: Any,
    results: Any,
    *,
    status: str = "done",
    started: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/record.json`` atomically and return its path."""
    now = time.time()
    record = {
        "experiment": experiment,
        "status": status,
        "config": to_jsonable(config),
        "environment": environment(),
        "started": started if started is not None else now,
        "finished": now,
        "duration_s": (now - started) if started is not None else 0.0,
        "results": to_jsonable(results),
    }
    if extra:
        record.update(to_jsonable(extra))
    path = Path(run_dir) / RECORD
    atomic_write_json(path, record)
    return path


def read_record(run_dir: Path) -> dict[str, Any]:
    with open(Path(run_dir) / RECORD) as f:
        return json.load(f)


def find_records(root: Path) -> list[Path]:
    """Every run directory below ``root`` (``root`` itself included) that holds a record."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob(RECORD))


# ---- resume ----------------------------------------------------------------------


def run_id(head_dim: int, scale: str, seed: int, lr: float | None = None) -> str:
    """``d{head_dim}-{scale}-s{seed}``, plus ``-lr3e-3`` when a sweep varies the learning rate."""
    base = f"d{head_dim}-{scale}-s{seed}"
    if lr is None:
        return base
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{base}-lr{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


# Train settings that change how a run is executed, not what it measures: a sweep
# resumed with another -j (so another thread count), checkpoint interval, device or
# attention path (fused and explicit agree to float tolerance) is still the same run.
_EXECUTION_ONLY = {"train": ("threads", "checkpoint_every", "device", "attention")}
# What makes two corpora the same: the text's hash and how it was cut into tokens,
# not the path or name it was read under ("wikitext-2" and its folder are one corpus).
_CORPUS_IDENTITY = ("sha256", "tokenizer", "vocab_size", "train_tokens", "valid_tokens")


def comparable_config(config: Any) -> dict[str, Any]:
    """The part of a training run's config ({"model", "train", "corpus"}) that decides its results."""
    cfg = json.loads(json.dumps(to_jsonable(config)))
    for section, keys in _EXECUTION_ONLY.items():
        for key in keys:
            cfg.get(section, {}).pop(key, None)
    corpus = cfg.get("corpus")
    if isinstance(corpus, dict) and any(k in corpus for k in _CORPUS_IDENTITY):
        cfg["corpus"] = {k: corpus[k] for k in _CORPUS_IDENTITY if k in corpus}
    return cfg


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix[:-1] or 'config'} {a!r} on disk, {b!r} asked"]


def run_state(run_dir: Path, config: Any, experiment: str = "train") -> str:
    """What to do with ``run_dir`` for a run of ``config``.

    "finished": a record with status done or diverged and the same config (keep it);
    "restart": nothing usable yet (no record, a record left "running" or "stopped"
    by an interrupted run, or one cut short): train from scratch, the log afresh;
    raises ``ConfigError`` when the folder holds a run of another config or
    experiment, so two experiments never mix in one folder."""
    path = Path(run_dir) / RECORD
    if not path.exists():
        return "restart"
    try:
        record = read_record(run_dir)
    except (OSError, ValueError):
        return "restart"  # records are written atomically: only a foreign hand leaves half of one
    if not isinstance(record, dict):
        return "restart"
    if record.get("experiment") != experiment:
        raise ConfigError(
            f"{run_dir} holds a {record.get('experiment')!r} run, not {experiment!r}; use another --out"
        )
    diff = _differences(comparable_config(record.get("config", {})), comparable_config(config))
    if diff:
        raise ConfigError(
            f"{run_dir} holds a run with another config ({'; '.join(diff[:3])}); "
            "use another --out, or delete that folder to retrain it"
        )
    return "finished" if record.get("status") in FINISHED else "restart"
