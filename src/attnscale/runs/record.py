"""The run record: one typed, versioned schema, and the only code that reads or writes it.

A run directory holds
    record.json        a ``Record`` (written atomically, as JSON by ``Record.to_json``)
    metrics.jsonl      training runs: one recorded step a line (flushed line by line)
    model.safetensors  finished training runs: the final weights (``attnscale inspect --model RUN_DIR``)
    checkpoint.pt      a training run cut short: what a rerun resumes from
    *.png              optional plots

Schema version 2 (``SCHEMA_VERSION``); a record of a newer version than this
attnscale knows is refused with a ``RecordError`` that names both versions.
Older records read as version 2 (``_upgrade``): version 1 named the head width
three ways, ``head_dim`` in a model config (None for d_model // n_heads), ``d_k``
in training results and ``width``/``widths`` in the spread and fresh records;
version 2 calls it ``head_dim`` (``head_dims`` for a list) everywhere, and a
model config always holds the number. Records written before versions existed
(no "schema" key) read as version 0, the fields of version 1.
``Record.results`` per experiment:

- spread: a list of rows {head_dim, scale, factor, pairs, raw_spread, scaled_spread, sqrt_d, raw_spread_se}.
- fresh: {"rows": [{head_dim, scale, init, words, sequences, effective_words_median, _p10,
  _p90, _mean, max_weight_mean, frozen_fraction, frozen_threshold, push_median, push_mean,
  example, example_row}], "illustration": {scores, multipliers, weights, effective_words}}.

A sweep's folder also holds ``floors.json`` (``FLOORS``): its corpus's no-attention floors, a ``Floors``
(``write_floors``/``read_floors``). It is not a run record, so readers of runs (``find``) never meet it;
sweeps written before it have none, and read as before.
- train: a ``TrainResults`` (``lm.train.train`` returns its fields). A metrics line
  (``TrainRun.history``) is {"step", "loss", "lr", "elapsed_s", and per measure of
  ``core.diagnostics.HEAD_MEASURES`` a ``[layer][head]`` list}; non-finite numbers are null.

A run trained by the Ray executor also says, in ``environment["ray_node"]``, which Ray
node trained it (``Record.ray_node``). The key was added within version 1: records
without it read as before, with ``ray_node`` None.

Every reader goes through ``read`` / ``TrainRun``; nothing else parses record.json.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

from attnscale.errors import ConfigError
from attnscale.files import atomic_write_json, to_jsonable

__all__ = [
    "SCHEMA_VERSION", "RECORD", "METRICS", "WEIGHTS", "CHECKPOINT", "FINISHED", "STATUSES",
    "RecordError", "NewerRecordError", "Record", "TrainResults", "TrainRun", "Floors", "FLOORS", "write_floors", "read_floors",
    "new", "write", "read", "find", "read_metrics", "environment",
]

SCHEMA_VERSION = 2
RECORD = "record.json"
METRICS = "metrics.jsonl"
WEIGHTS = "model.safetensors"
CHECKPOINT = "checkpoint.pt"
STATUSES = ("running", "stopped", "done", "diverged")
FINISHED = ("done", "diverged")  # a run in one of these states is never trained again
FLOORS = "floors.json"  # a sweep's counted floors, beside its runs


class RecordError(ConfigError):
    """A record.json that cannot be read: damaged, not a record, or of a newer schema."""


class NewerRecordError(RecordError):
    """A record of a schema version newer than this attnscale reads: never overwritten."""


@dataclass(frozen=True)
class Record:
    """What one run was (experiment, config, environment) and what it gave (status, results)."""

    experiment: str
    status: str
    config: dict[str, Any]
    results: Any
    environment: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    group: str | None = None  # "dynamics", "sweep", ... for training runs that belong to an experiment
    copied_from: str | None = None  # a finished run copied from another folder rather than trained again
    notes: tuple[str, ...] = ()  # what happened that the numbers do not show (a damaged checkpoint, ...)
    schema: int = SCHEMA_VERSION

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished - self.started)

    @property
    def finished_ok(self) -> bool:
        return self.status in FINISHED

    @property
    def ray_node(self) -> dict[str, Any] | None:
        """The Ray node that trained the run ({"node_id", "node_ip", "hostname"}, in
        ``environment``); None for a run trained without Ray, and in records written before."""
        node = self.environment.get("ray_node")
        return node if isinstance(node, dict) else None

    def on_ray_node(self, node: dict[str, Any]) -> "Record":
        """This record, saying which Ray node trained the run."""
        return replace(self, environment={**self.environment, "ray_node": dict(node)})

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["duration_s"] = self.duration_s
        out["notes"] = list(self.notes)
        return to_jsonable(out)

    @classmethod
    def from_json(cls, data: Any, where: str = "record") -> "Record":
        if not isinstance(data, dict):
            raise RecordError(f"{where} is not a run record (not a JSON object)")
        version = data.get("schema", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise NewerRecordError(f"{where} has record schema version {version!r}; this attnscale reads versions "
                              f"0 to {SCHEMA_VERSION}: upgrade attnscale to read it")
        missing = [k for k in ("experiment", "status", "config") if k not in data]
        if missing:
            raise RecordError(f"{where} lacks {', '.join(missing)}: not a run record")
        if not isinstance(data["config"], dict):
            raise RecordError(f"{where}: config is not an object")
        if version < 2:
            data = _upgrade(data)
        return cls(
            experiment=str(data["experiment"]),
            status=str(data["status"]),
            config=data["config"],
            results=data.get("results"),
            environment=data.get("environment") or {},
            started=float(data.get("started") or 0.0),
            finished=float(data.get("finished") or 0.0),
            group=data.get("group"),
            copied_from=data.get("copied_from"),
            notes=tuple(data.get("notes") or ()),
            schema=SCHEMA_VERSION,  # read once, it is a record of this version
        )


def _renamed(d: Any, old: str, new: str) -> Any:
    """``d`` with key ``old`` called ``new`` (``d`` itself where it is not a dict or has no ``old``)."""
    if not isinstance(d, dict) or old not in d:
        return d
    return {(new if k == old else k): v for k, v in d.items()}


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A record of version 0 or 1 as version 2 reads it: the head width called ``head_dim``
    (``head_dims`` for a list) where it was ``d_k`` or ``width``/``widths``, a model config's
    None head_dim resolved to d_model // n_heads. Nothing else changes."""
    config, results = dict(data["config"]), data.get("results")
    model = config.get("model")
    if isinstance(model, dict) and model.get("head_dim", 0) is None and model.get("n_heads"):
        config["model"] = {**model, "head_dim": int(model["d_model"]) // int(model["n_heads"])}
    experiment = data.get("experiment")
    if experiment == "train":
        results = _renamed(results, "d_k", "head_dim")
    elif experiment in ("spread", "fresh"):
        config = _renamed(config, "widths", "head_dims")
        if experiment == "spread" and isinstance(results, list):
            results = [_renamed(r, "width", "head_dim") for r in results]
        elif isinstance(results, dict) and isinstance(results.get("rows"), list):
            results = {**results, "rows": [_renamed(r, "width", "head_dim") for r in results["rows"]]}
    return {**data, "config": config, "results": results}


# ---- environment, write, read -------------------------------------------------------


def _git_hash() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions, git hash and hardware, for the record; ``device`` describes where a run trained."""
    import numpy
    import torch

    import attnscale
    from attnscale.core.device import native_bf16

    env = {
        "attnscale": attnscale.__version__,
        "git": _git_hash(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # the GPU this process uses, named only once it has started CUDA: asking earlier starts it, and a
        # sweep's parent (which writes the "running" records) would hold an idle CUDA context all along
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
        # bf16 dot products in the CPU: where they are, "auto" trains in bf16 and the numbers move a little
        "cpu_native_bf16": native_bf16(),
    }
    if device:
        env["device"] = dict(device)
    return env


def new(experiment: str, config: Any, results: Any, *, status: str = "done", started: float | None = None,
        group: str | None = None, notes: Sequence[str] = (), device: dict[str, Any] | None = None) -> Record:
    """A record finished now, with this process's environment."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    now = time.time()
    return Record(experiment=experiment, status=status, config=to_jsonable(config), results=to_jsonable(results),
                  environment=environment(device), started=now if started is None else started, finished=now,
                  group=group, notes=tuple(notes))


def write(run_dir: Path, record: Record) -> Path:
    """``run_dir/record.json``, atomically: a reader sees the old record or the new one."""
    path = Path(run_dir) / RECORD
    atomic_write_json(path, record.to_json())
    return path


def read(run_dir: Path) -> Record:
    """The record in ``run_dir``; ``RecordError`` (one line, naming the file) when it cannot be read."""
    path = Path(run_dir) / RECORD
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path} does not exist: no run record there") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path} cannot be read ({type(e).__name__}); delete that run folder to redo it") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); "
                          "delete that run folder to redo it") from None
    return Record.from_json(data, str(path))


def find(root: Path) -> list[Path]:
    """Every run directory below ``root`` (``root`` itself included) that holds a record."""
    return sorted(p.parent for p in Path(root).rglob(RECORD))


def read_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The lines of ``run_dir/metrics.jsonl`` and how many could not be read (a run
    killed mid-write leaves a partial last line)."""
    lines, bad = [], 0
    path = Path(run_dir) / METRICS
    if path.exists():
        for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(line, dict):
                lines.append(line)
            else:
                bad += 1
    return lines, bad


# ---- training runs ------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResults:
    """What ``lm.train.train`` measured. ``perplexity`` and ``valid_loss`` are None unless the run is "done"."""

    status: str
    steps_done: int
    diverged_at: int | None = None
    final_train_loss: float | None = None
    valid_loss: float | None = None
    perplexity: float | None = None
    eval_tokens: int = 0
    head_dim: int | None = None
    scale: str | None = None
    init: str | None = None
    params: int | None = None
    resumed_from: int | None = None
    train_seconds: float | None = None
    tokens_per_s: float | None = None
    threads: int | None = None
    dtype: str | None = None
    attention: str | None = None  # the path non-recording steps took: "fused" or "explicit"
    weights: str | None = None  # what the step computed on: "fp32" weights (autocast) or a "bf16" copy of fp32 masters
    device: dict[str, Any] | None = None  # core.device.describe_device: where the run trained
    start: dict[str, Any] | None = None  # lm.train.summarize of the first recorded step
    end: dict[str, Any] | None = None  # ... and of the last
    history: tuple[dict[str, Any], ...] = ()
    # the training loss at every step taken, in order; () in records written before (``history`` has it
    # at the recording steps)
    losses: tuple[float, ...] = ()
    # held-out {"step", "valid_loss", "perplexity"} every ``eval_every`` steps; () in records written before
    evals: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    # the actions the watch's alerts took (``watch/actions.py``), {"step", "action", "alert", ...}; () in
    # records written before, and of runs without a watch
    actions: tuple[dict[str, Any], ...] = ()

    def __post_init__(self):
        if self.status != "done":  # one rule, here: only a finished, finite run has a perplexity
            object.__setattr__(self, "perplexity", None)
            object.__setattr__(self, "valid_loss", None)

    @classmethod
    def from_json(cls, data: Any, where: str = "results") -> "TrainResults":
        if not isinstance(data, dict):
            raise RecordError(f"{where}: training results are not an object")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["history"] = tuple(kwargs.get("history") or ())
        kwargs["notes"] = tuple(kwargs.get("notes") or ())
        kwargs["evals"] = tuple(kwargs.get("evals") or ())
        kwargs["losses"] = tuple(kwargs.get("losses") or ())
        kwargs["actions"] = tuple(kwargs.get("actions") or ())
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise RecordError(f"{where}: {e}") from None

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))


@dataclass(frozen=True)
class Floors:
    """What a model without attention does on a sweep's corpus (``analysis.floors``): held-out
    perplexity of unigram and bigram counts from the training split, and the smoothing rule."""

    unigram_ppl: float
    bigram_ppl: float
    smoothing: str
    corpus: dict[str, Any] = field(default_factory=dict)  # ``Corpus.describe()``: which corpus was counted

    @classmethod
    def from_json(cls, data: Any, where: str = "floors") -> "Floors":
        try:
            return cls(float(data["unigram_ppl"]), float(data["bigram_ppl"]), str(data["smoothing"]),
                       dict(data.get("corpus") or {}))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise RecordError(f"{where}: the floors need unigram_ppl, bigram_ppl and smoothing") from None

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))


def write_floors(folder: Path, floors: Floors) -> Path:
    """``folder/floors.json``, atomically."""
    path = Path(folder) / FLOORS
    atomic_write_json(path, floors.to_json())
    return path


def read_floors(folder: Path) -> Floors | None:
    """The floors in ``folder`` (None where there are none); ``RecordError`` where the file is damaged."""
    path = Path(folder) / FLOORS
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise RecordError(f"{path} cannot be read; delete it to count the floors again") from None
    return Floors.from_json(data, str(path))


def _as_layers(line: dict[str, Any], measures: Sequence[str]) -> dict[str, Any]:
    """A metrics line, {"spread": [[per head] per layer], ...}, as {"layers": [{"layer": i, "spread": [...]}, ...]}."""
    if not isinstance(line.get("spread"), list):
        return line
    layers = [{"layer": i, **{k: line[k][i] for k in measures if k in line}} for i in range(len(line["spread"]))]
    return {**{k: v for k, v in line.items() if k not in measures}, "layers": layers}


def _typed(cls, data: dict[str, Any], where: str):
    """``cls`` from the record's section ``data``, its fields only; a ``RecordError`` naming the record where
    a required one is missing or a value no longer allowed."""
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except (TypeError, ConfigError) as e:
        raise RecordError(f"{where} cannot be read ({e}); delete that run folder to redo it") from None


@dataclass(frozen=True)
class TrainRun:
    """A training run read back: its record, its typed results and its recorded steps."""

    path: Path
    record: Record
    results: TrainResults
    history: tuple[dict[str, Any], ...]  # metrics lines (metrics.jsonl where present, else the record's copy)
    unreadable_lines: int = 0

    @classmethod
    def load(cls, run_dir: Path, record: Record | None = None) -> "TrainRun":
        run_dir = Path(run_dir)
        record = record if record is not None else read(run_dir)
        if record.experiment != "train":
            raise RecordError(f"{run_dir / RECORD} holds a {record.experiment!r} run, not a training run")
        results = TrainResults.from_json(record.results or {"status": record.status, "steps_done": 0},
                                         f"{run_dir / RECORD}")
        lines, bad = read_metrics(run_dir)
        return cls(run_dir, record, results, tuple(lines or results.history), bad)

    # what the run was: the record's sections as written, and as the typed configs that made them
    @property
    def model(self) -> dict[str, Any]:
        return self.record.config.get("model", {})

    @property
    def train(self) -> dict[str, Any]:
        return self.record.config.get("train", {})

    @functools.cached_property
    def model_config(self):
        """The model's config as ``lm.model.ModelConfig``, or ``lm.hf_family.LlamaModelConfig`` for a Llama;
        a setting added since the record was written takes its default, one removed since is dropped."""
        from attnscale.lm.hf_family import FAMILY, LlamaModelConfig
        from attnscale.lm.model import ModelConfig

        return _typed(LlamaModelConfig if self.model.get("family") == FAMILY else ModelConfig, self.model,
                      f"{self.path / RECORD}: its model config")

    @functools.cached_property
    def train_config(self):
        """The training config as ``lm.train.TrainConfig`` (added settings at their defaults, as ``model_config``)."""
        from attnscale.lm.train import TrainConfig

        return _typed(TrainConfig, self.train, f"{self.path / RECORD}: its train config")

    @property
    def corpus(self) -> dict[str, Any]:
        return self.record.config.get("corpus", {})

    run_id = property(lambda self: self.path.name)
    scale = property(lambda self: self.model.get("scale", "?"))
    seed = property(lambda self: self.train.get("seed"))
    lr = property(lambda self: self.train.get("lr"))
    group = property(lambda self: self.record.group or "train")
    status = property(lambda self: self.record.status)

    @property
    def head_dim(self) -> int:
        m = self.model
        return int(m.get("head_dim") or m["d_model"] // m["n_heads"])

    # what it gave
    perplexity = property(lambda self: self.results.perplexity if self.status == "done" else None)
    diverged_at = property(lambda self: self.results.diverged_at)
    steps_done = property(lambda self: self.results.steps_done)

    @property
    def recorded(self) -> list[dict[str, Any]]:
        """The recorded steps that carry diagnostics, each as per-layer dicts (``{"layers": [...]}``)."""
        from attnscale.core.diagnostics import HEAD_MEASURES

        return [x for x in (_as_layers(line, HEAD_MEASURES) for line in self.history) if x.get("layers")]

    def line(self, which: str) -> dict[str, Any] | None:
        """The "first" or "last" recorded step with diagnostics, per layer; None if there is none."""
        got = self.recorded
        if not got:
            return None
        return got[0] if which == "first" else got[-1]

    def diag_mean(self, which: str, key: str) -> float:
        """Mean over layers and heads of ``key`` at the "first" or "last" recorded step (NaN when absent)."""
        from attnscale.core.diagnostics import reduce_heads

        return reduce_heads([layer.get(key, []) for layer in (self.line(which) or {}).get("layers", [])])

    def layer_means(self, which: str, key: str) -> list[float]:
        """Mean over heads of ``key``, one value per layer, at the "first" or "last" recorded step."""
        from attnscale.core.diagnostics import reduce_heads

        return reduce_heads([layer.get(key, []) for layer in (self.line(which) or {"layers": []})["layers"]], per_layer=True)

    def copied(self, group: str, copied_from: str) -> Record:
        """This run's record as it reads when copied into another experiment's folder."""
        return replace(self.record, group=group, copied_from=copied_from)
