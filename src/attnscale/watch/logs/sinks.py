"""Where a watch's records go: a JSONL log, a CSV table, TensorBoard event files, W&B.

Every sink takes a ``WatchLine`` per probe step (``write``) and is closed once
(``close``, which flushes). TensorBoard and W&B get the flat scalars a reader
plots beside the loss: ``attn/layer_{l}/head_{h}/{measure}``, the model-wide
``attn/...`` summaries and the watch's own ``watch/seconds`` and ``watch/share``.
tensorboard and wandb load only when their sink is made (extra ``attnscale[watch]``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from attnscale.errors import ConfigError
from attnscale.watch.logs.line import WatchLine

__all__ = ["Sink", "JsonlSink", "CsvSink", "TensorBoardSink", "WandbSink", "scalars"]


def scalars(record: WatchLine) -> dict[str, float]:
    """The record as flat scalars: per head and measure, the summaries, the watch's own cost.
    Non-finite values stay as they are (TensorBoard and W&B both plot NaN as a gap)."""
    out = {}
    for layer, table_MH in enumerate(record.values):
        for m, measure in enumerate(record.measures):
            for head, value in enumerate(table_MH[m]):
                out[f"attn/layer_{layer}/head_{head}/{measure}"] = math.nan if value is None else float(value)
    for layer, heads in enumerate(record.bias):  # only where a layer has a bias: its range, apart from the scores
        for head, pair in enumerate(heads):
            if pair is not None and pair[0] is not None and pair[0] == pair[0]:
                out[f"attn/layer_{layer}/head_{head}/bias_min"], out[f"attn/layer_{layer}/head_{head}/bias_max"] = map(float, pair)
    out.update({k: float(v) for k, v in record.summary.items()})
    out["attn/alerts"] = float(len(record.alerts))
    clip = record.qk_clip
    if clip:  # QK-Clip: per head the smallest factor on its scores and the largest S_max since the probe before
        for layer, (gamma_H, s_max_H) in enumerate(zip(clip["gamma"], clip["s_max"])):
            for head, (gamma, s_max) in enumerate(zip(gamma_H, s_max_H)):
                out[f"qk_clip/layer_{layer}/head_{head}/gamma"] = float(gamma)
                out[f"qk_clip/layer_{layer}/head_{head}/s_max"] = float(s_max)
        out["qk_clip/min_gamma"] = float(min((g for layer in clip["gamma"] for g in layer), default=1.0))
        out["qk_clip/clipped_heads"] = float(sum(n > 0 for layer in clip["clipped_steps"] for n in layer))
    out.update({f"watch/{k}": float(v) for k, v in record.watch.items()})
    return out


class Sink:
    """A place records go; subclasses write one record per probe step."""

    def write(self, record: WatchLine) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _opened(path: Path | str, what: str):
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path, path.open("a", encoding="utf-8", newline="")
    except OSError as e:
        raise ConfigError(f"{what}: cannot write {str(path)!r} ({e.strerror or e}); give a writable path") from None


class JsonlSink(Sink):
    """The watch log: one versioned ``WatchLine`` a line, appended and flushed line by line, so a
    run that dies keeps every probe before it. ``attnscale watch-report`` reads it."""

    def __init__(self, path: Path | str):
        self.path, self._file = _opened(path, "JsonlSink")

    def write(self, record: WatchLine) -> None:
        self._file.write(record.to_line())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class CsvSink(Sink):
    """One row per probe step and head: step, time, layer, head, rows counted, then each measure."""

    def __init__(self, path: Path | str):
        self.path, self._file = _opened(path, "CsvSink")
        self._writer = csv.writer(self._file)
        self._header = self.path.stat().st_size > 0  # appending to a table that has its header

    def write(self, record: WatchLine) -> None:
        if not self._header:
            self._writer.writerow(["step", "time", "layer", "head", "rows", *record.measures])
            self._header = True
        for layer, table_MH in enumerate(record.values):
            for head in range(len(table_MH[0])):
                cells = ["" if table_MH[m][head] is None else table_MH[m][head] for m in range(len(record.measures))]
                self._writer.writerow([record.step, record.time, layer, head, record.rows[layer][head], *cells])
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink(Sink):
    """TensorBoard event files in ``log_dir`` (torch.utils.tensorboard's writer), at the probe's step."""

    def __init__(self, log_dir: Path | str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("TensorBoardSink needs tensorboard; install the extra from the clone: pip install -e '.[watch]'") from None
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, record: WatchLine) -> None:
        for key, value in scalars(record).items():
            self._writer.add_scalar(key, value, record.step, walltime=record.time)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink(Sink):
    """Weights & Biases: the scalars go to the active run (``wandb.run``), or to one this sink starts with
    ``wandb.init(**init)``; offline mode (``WANDB_MODE=offline``) writes the run's files locally.
    ``step=True`` logs at the probe's step (W&B's steps must then only grow, as the training loop's do);
    ``step=False`` leaves W&B's own counter and adds ``watch/step``."""

    def __init__(self, step: bool = True, **init):
        try:
            import wandb
        except ImportError:
            raise ConfigError("WandbSink needs wandb; install the extra from the clone: pip install -e '.[watch]'") from None
        self._owned = wandb.run is None
        self.run = wandb.init(**init) if self._owned else wandb.run
        self._step = step

    def write(self, record: WatchLine) -> None:
        values = scalars(record)
        if self._step:
            self.run.log(values, step=record.step)
        else:
            self.run.log({**values, "watch/step": record.step})

    def close(self) -> None:
        if self._owned:
            self.run.finish()
