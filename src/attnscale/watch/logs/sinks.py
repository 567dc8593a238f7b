"""Where a watch's records go: a JSONL log, a CSV table, TensorBoard event files, W&B.

Every sink takes a ``WatchLine`` per probe step (``write``) and is closed once
(``close``, which flushes). A Watch refuses a sink that is closed (``closed``), and the
callbacks ``reopen`` theirs for a second fit of the same model (a file sink appends).
TensorBoard and W&B get the flat scalars a reader plots beside the loss:
``attn/layer_{l}/head_{h}/{measure}``, the model-wide ``attn/...`` summaries and the watch's own ``watch/seconds`` and ``watch/share``.
``detail`` ("heads", "layers" or "summary", ``detail.py``) says how much of that a
TensorBoard, W&B or CSV sink writes; made without one, a sink takes the detail of the
Watch it is given to. The JSONL log keeps every head whatever the detail.
``images=True`` adds a layer × head heatmap per probe to TensorBoard and W&B
(``heatmaps.py``; off by default).
tensorboard and wandb load only when their sink is made (extra ``attnscale[watch]``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from attnscale.errors import ConfigError
from attnscale.watch.logs.detail import check_detail, layer_table, per_layer
from attnscale.watch.logs.heatmaps import heatmap, image_measures
from attnscale.watch.logs.line import WatchLine

__all__ = ["Sink", "JsonlSink", "CsvSink", "TensorBoardSink", "WandbSink", "scalars"]


def scalars(record: WatchLine, detail: str = "heads") -> dict[str, float]:
    """The record as flat scalars: per head (``detail="heads"``) or per layer (``"layers"``) and measure, then
    the summaries and the watch's own cost (``detail.py``). Non-finite values stay as they are (TensorBoard and
    W&B both plot NaN as a gap)."""
    check_detail(detail)
    out = {}
    if detail == "heads":
        for layer, table_MH in enumerate(record.values):
            for m, measure in enumerate(record.measures):
                for head, value in enumerate(table_MH[m]):
                    out[f"attn/layer_{layer}/head_{head}/{measure}"] = math.nan if value is None else float(value)
        for layer, heads in enumerate(record.bias):  # only where a layer has a bias: its range, apart from the scores
            for head, pair in enumerate(heads):
                if pair is not None and pair[0] is not None and pair[0] == pair[0]:
                    out[f"attn/layer_{layer}/head_{head}/bias_min"], out[f"attn/layer_{layer}/head_{head}/bias_max"] = map(float, pair)
    elif detail == "layers":
        for layer, row in enumerate(layer_table(record)):
            out.update({f"attn/layer_{layer}/{measure}": value for measure, value in zip(record.measures, row)})
        for b, name in enumerate(("bias_min", "bias_max")):
            grid = [[None if pair is None else pair[b] for pair in heads] for heads in record.bias]
            for layer, value in enumerate(per_layer(name, grid) if record.bias else ()):
                if value == value:
                    out[f"attn/layer_{layer}/{name}"] = value
    out.update({k: float(v) for k, v in record.summary.items()})
    out["attn/alerts"] = float(len(record.alerts))
    clip = record.qk_clip
    if clip:  # QK-Clip: per head the smallest factor on its scores and the largest S_max since the probe before
        if detail == "heads":
            for layer, (gamma_H, s_max_H) in enumerate(zip(clip["gamma"], clip["s_max"])):
                for head, (gamma, s_max) in enumerate(zip(gamma_H, s_max_H)):
                    out[f"qk_clip/layer_{layer}/head_{head}/gamma"] = float(gamma)
                    out[f"qk_clip/layer_{layer}/head_{head}/s_max"] = float(s_max)
        elif detail == "layers":
            for name in ("gamma", "s_max"):
                out.update({f"qk_clip/layer_{l}/{name}": v for l, v in enumerate(per_layer(name, clip[name]))})
        after = clip.get("s_max_after")  # qk_clip_check's: S_max of the step's batch after the update and the clip
        if after is not None and detail == "heads":
            for layer, s_H in enumerate(after):
                out.update({f"qk_clip/layer_{layer}/head_{head}/s_max_after": float(v) for head, v in enumerate(s_H)})
        if after is not None:
            out["qk_clip/max_s_max_after"] = float(max((v for layer in after for v in layer if v == v), default=math.nan))
        out["qk_clip/min_gamma"] = float(min((g for layer in clip["gamma"] for g in layer), default=1.0))
        out["qk_clip/clipped_heads"] = float(sum(n > 0 for layer in clip["clipped_steps"] for n in layer))
    out.update({f"watch/{k}": float(v) for k, v in record.watch.items()})
    return out


class Sink:
    """A place records go; subclasses write one record per probe step. ``detail``: how much of each record a
    sink of scalars writes (None: the detail of the Watch it is given to, which sets it)."""

    detail: str | None = None
    closed = False  # True once closed, by its own close or the Watch's: a new Watch refuses it

    def write(self, record: WatchLine) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def reopen(self) -> None:
        """Open again after ``close``, for the next fit of the model it followed (a file sink appends)."""
        self.closed = False

    def __repr__(self) -> str:
        where = getattr(self, "path", None) or getattr(self, "log_dir", None)
        return f"{type(self).__name__}({'' if where is None else repr(str(where))})"


def _path(path, what: str, name: str = "path") -> Path:
    """``path`` as a Path, or a ConfigError naming the argument (None, a number or "" is no file to write)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"{what}'s {name} takes a file path (a str or Path), got {path!r}")
    return Path(path)


def _opened(path: Path | str, what: str):
    path = _path(path, what)
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
        self.closed = True
        self._file.close()

    def reopen(self) -> None:
        self.path, self._file = _opened(self.path, "JsonlSink")
        self.closed = False


class CsvSink(Sink):
    """One row per probe step and head: step, time, layer, head, rows counted, then each measure. With
    ``detail="layers"`` one row per step and layer (no head column, the layer's rows, each measure over its
    heads); with ``"summary"`` one row per step: step, time, the model-wide summaries, the alerts."""

    def __init__(self, path: Path | str, detail: str | None = None):
        if detail is not None:
            check_detail(detail)
        self.detail = detail
        self.reopen(_path(path, "CsvSink"))

    def reopen(self, path: Path | str | None = None) -> None:
        self.path, self._file = _opened(self.path if path is None else path, "CsvSink")
        self._writer = csv.writer(self._file)
        self._header = self.path.stat().st_size > 0  # appending to a table that has its header
        self.closed = False

    def _rows(self, record: WatchLine, detail: str) -> tuple[list, list[list]]:
        """(the header, the rows) of one record."""
        if detail == "summary":
            keys = list(record.summary)
            return ["step", "time", *keys, "alerts"], [[record.step, record.time, *(record.summary[k] for k in keys),
                                                         len(record.alerts)]]
        if detail == "layers":
            rows = [[record.step, record.time, layer, sum(record.rows[layer]), *values]
                    for layer, values in enumerate(layer_table(record))]
            return ["step", "time", "layer", "rows", *record.measures], rows
        rows = []
        for layer, table_MH in enumerate(record.values):
            for head in range(len(table_MH[0])):
                cells = ["" if table_MH[m][head] is None else table_MH[m][head] for m in range(len(record.measures))]
                rows.append([record.step, record.time, layer, head, record.rows[layer][head], *cells])
        return ["step", "time", "layer", "head", "rows", *record.measures], rows

    def write(self, record: WatchLine) -> None:
        header, rows = self._rows(record, self.detail or "heads")
        if not self._header:
            self._writer.writerow(header)
            self._header = True
        self._writer.writerows([["" if v != v else v for v in row] for row in rows])  # NaN: an empty cell
        self._file.flush()

    def close(self) -> None:
        self.closed = True
        self._file.close()


def _shown(detail: str | None, images) -> tuple[str | None, tuple[str, ...]]:
    """A sink's ``detail`` (None: its Watch's), checked, and the measures it draws as images."""
    if detail is not None:
        check_detail(detail)
    return detail, image_measures(images)


class TensorBoardSink(Sink):
    """TensorBoard event files in ``log_dir`` (torch.utils.tensorboard's writer), at the probe's step.
    ``images``: True (max_score, effective_words, frozen_fraction) or the measures to draw as layer × head
    heatmaps (``add_image``, tag ``attn/heatmap/{measure}``); off by default."""

    def __init__(self, log_dir: Path | str, detail: str | None = None, images: bool | Sequence[str] = False):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("TensorBoardSink needs tensorboard; install the extra from the clone: pip install -e '.[watch]'") from None
        self.detail, self.images = _shown(detail, images)
        self.log_dir = _path(log_dir, "TensorBoardSink", "log_dir")
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, record: WatchLine) -> None:
        for key, value in scalars(record, self.detail or "heads").items():
            self._writer.add_scalar(key, value, record.step, walltime=record.time)
        for measure in self.images:
            image, _, _ = heatmap(record.grid(measure), measure)
            self._writer.add_image(f"attn/heatmap/{measure}", image, record.step, walltime=record.time,
                                   dataformats="HWC")
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink(Sink):
    """Weights & Biases: the scalars go to the active run (``wandb.run``), or to one this sink starts with
    ``wandb.init(**init)``; offline mode (``WANDB_MODE=offline``) writes the run's files locally.
    ``step=True`` logs at the probe's step (W&B's steps must then only grow, as the training loop's do);
    ``step=False`` leaves W&B's own counter and adds ``watch/step``. ``images``: as ``TensorBoardSink``'s,
    each a ``wandb.Image`` whose caption gives the values of its darkest and brightest colours."""

    def __init__(self, step: bool = True, detail: str | None = None, images: bool | Sequence[str] = False, **init):
        try:
            import wandb
        except ImportError:
            raise ConfigError("WandbSink needs wandb; install the extra from the clone: pip install -e '.[watch]'") from None
        if not isinstance(step, bool):
            raise ConfigError(f"WandbSink's step takes True (log at the probe's step) or False, got {step!r}")
        self.detail, self.images = _shown(detail, images)
        self._owned, self._init = wandb.run is None, init
        self.run = wandb.init(**init) if self._owned else wandb.run
        self._step = step
        self._image = wandb.Image

    def write(self, record: WatchLine) -> None:
        values: dict = scalars(record, self.detail or "heads")
        for measure in self.images:
            image, lo, hi = heatmap(record.grid(measure), measure)
            values[f"attn/heatmap/{measure}"] = self._image(
                image, caption=f"{measure} at step {record.step}: layers down, heads across; {lo:.4g} dark to {hi:.4g} bright")
        if self._step:
            self.run.log(values, step=record.step)
        else:
            self.run.log({**values, "watch/step": record.step})

    def close(self) -> None:
        self.closed = True
        if self._owned:
            self.run.finish()

    def reopen(self) -> None:
        if self._owned:  # a run of its own again (a finished W&B run takes no more)
            import wandb

            self.run = wandb.init(**self._init)
        self.closed = False
