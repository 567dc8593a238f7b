"""One self-contained HTML page from a watch log (``attnscale watch-report WATCH_LOG``).

What a reader sees, from the log's records alone (``watch.logs.line.read_watch_log``):
- the last probe's model-wide numbers, named as the README names the measures (each beside its key in the
  log), a share as a percent;
- heatmaps of every head (rows: layer.head, "sink" or "prev" after a head the baseline marks a sink or a
  previous-token head) over the probe steps (columns) for
  effective words and max |score|, so a head that collapses or whose logits grow
  stands out as one row changing colour;
- the frozen share of rows over steps, per layer (mean of its heads) and model-wide;
- the alerts on the same step axis, one mark per firing (a panel drawn only where one fired), and a table of
  the first firing of each alert and head;
- effective words over steps beside what random scores predict at the same spread
  (``core.gaussian_scores``: softmax over i.i.d. N(0, spread²) scores, rows of the
  probe's length, causal unless told otherwise): a head far below its reference
  attends more sharply than noise at its own spread would;
- the baseline's sink and previous-token heads (``core/head_kinds.py``), where the log marks them, each with its
  effective words then and at the last probe.

The page never replaces what it did not write: not the log it reads, nor any file
but a page of its own (``check_out``: a marker in the page's head says so). A log
that holds several runs (a ``JsonlSink`` appends) is drawn for its last run, with a
note naming the lines of the others, rather than refused: the last run is the one a
user follows or has just ended, and the others stay in the file, untouched. A killed
run's cut last line is left out.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from attnscale import drawing
from attnscale.errors import ConfigError
from attnscale.files import atomic_write_bytes
from attnscale.report import render
from attnscale.report.blocks import Heading, Para, Image, Table
from attnscale.runs import writers
from attnscale.watch.logs.line import EmptyLogError, WatchLine, WatchLog, read_log, read_watch_log  # noqa: F401  read_log: as before

__all__ = ["build", "follow", "check_out", "check_follow", "page", "reference_words", "first_firings", "grid_over_steps",
           "baseline_kinds", "head_labels", "MARK"]

MARK = writers.page_mark("watch-report")  # how check_out knows a page of its own (runs.writers)
DRAWN = ("spread", "max_score", "effective_words", "frozen_fraction")  # the measures the page reads


def check_out(log: Path | str, out: Path | str) -> None:
    """A ``ConfigError`` where writing the page to ``out`` would lose something: ``out`` is the log itself,
    a folder, or a file that is not a page watch-report wrote."""
    log, out = Path(log), Path(out)
    same = out.resolve() == log.resolve() or (out.exists() and log.exists() and os.path.samefile(out, log))
    if same:
        raise ConfigError(f"--out {str(out)!r} is the watch log it reads; give another file for the page "
                          "(default: the log's name with .html)")
    if out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a folder; give the page's file name, e.g. {str(out / 'watch.html')!r}")
    writers.check_file(out, "watch-report", what="page")  # the one rule every command writes by


def _check_drawn(records: list[WatchLine], where: Path) -> None:
    missing = [m for m in DRAWN if m not in records[-1].measures]
    if missing:
        raise ConfigError(f"{where} lacks the measures {', '.join(missing)} the page draws; "
                          "give a log a Watch wrote")


def grid_over_steps(records: list[WatchLine], measure: str) -> np.ndarray:
    """(layers·heads) × steps: row l·H + h is layer l, head h; null (non-finite) is NaN."""
    cols = [np.array([[np.nan if v is None else v for v in heads] for heads in r.grid(measure)], dtype=float).ravel()
            for r in records]
    return np.stack(cols, axis=1)


def reference_words(record: WatchLine, causal: bool = True) -> tuple[float, float]:
    """(measured, random-score reference): mean over heads of effective words, and of what random
    Gaussian scores at each head's own spread give for rows of the probe's length."""
    from attnscale.core.gaussian_scores import expected_effective_words

    keys = int(record.probe.get("tokens", 0))
    spread = np.array(record.grid("spread"), dtype=float)
    words = np.array(record.grid("effective_words"), dtype=float)
    if keys < 2:
        return float(np.nanmean(words)), math.nan
    return float(np.nanmean(words)), float(np.nanmean(expected_effective_words(spread, keys, causal=causal)))


def first_firings(records: list[WatchLine]) -> list[dict]:
    """The first firing of each (alert, layer, head), in step order."""
    seen, out = set(), []
    for r in records:
        for a in r.alerts:
            key = (a["alert"], a["layer"], a["head"])
            if key not in seen:
                seen.add(key)
                out.append(a)
    return out


def baseline_kinds(records: list[WatchLine]) -> tuple[int, list[list[str]]] | None:
    """(step, per layer and head "sink", "previous" or "") of the record that marks the heads' kinds (the run's
    baseline, ``core/head_kinds.py``), or None where no record does (a run measured in the training forward, a
    resumed one whose baseline is in an earlier log, a log of an older watch)."""
    return next(((r.step, r.kinds) for r in records if r.kinds), None)


def head_labels(records: list[WatchLine]) -> list[str]:
    """layer.head of every row of the heatmaps, with the head's kind at the baseline where it has one."""
    L, H = records[-1].layers, records[-1].heads
    kinds = (baseline_kinds(records) or (0, []))[1]
    tag = {"sink": " sink", "previous": " prev"}

    def kind(l, h):
        return tag.get(kinds[l][h], "") if l < len(kinds) and h < len(kinds[l]) else ""

    return [f"{l}.{h}{kind(l, h)}" for l in range(L) for h in range(H)]


def _kinds_blocks(records: list[WatchLine]) -> list:
    """The baseline's sink and previous-token heads, each with its effective words then and at the last probe:
    what trained heads look like, not a collapse; nothing where no record marks them."""
    found = baseline_kinds(records)
    if found is None:
        return []
    step, kinds = found
    first = next(r for r in records if r.step == step and r.kinds)
    last = records[-1]
    named = {"sink": "sink", "previous": "previous-token"}
    rows = [[l, h, named[k], _number(first.grid("effective_words")[l][h]), _number(last.grid("effective_words")[l][h])]
            for l, layer in enumerate(kinds) for h, k in enumerate(layer) if k and l < last.layers and h < last.heads]
    rule = ("A sink head puts at least half of a row's weight on the first key the row sees; a previous-token "
            "head at least half on the key just before the row's own token (the mean over the probe's rows that "
            f"see two keys, read once, on the baseline's probe at step {step}). In a healthy trained model such heads "
            "are where the fewest effective words are (under 2 for many): a fall from where a head started "
            "(Collapsed(relative=True)) is the alarm, not the level.")
    if not rows:
        return [Heading(2, "Sink and previous-token heads"), Para(f"No head was a sink or previous-token head at "
                                                                   f"step {step}. " + rule)]
    return [Heading(2, "Sink and previous-token heads"), Para(rule),
            Table(["layer", "head", "kind", f"effective words at step {step}", f"at step {last.step}"], rows)]


def _heatmaps(records, path: Path) -> Path:
    from matplotlib.colors import LogNorm

    plt = drawing.pyplot()
    steps = [r.step for r in records]
    L, H = records[-1].layers, records[-1].heads
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.2 + 0.22 * L * H + 2), squeeze=False)
    for ax, (measure, label, cmap) in zip(axes[0], (("effective_words", "effective words", "viridis"),
                                                    ("max_score", "max |score|", "magma"))):
        grid = grid_over_steps(records, measure)
        positive = grid[np.isfinite(grid) & (grid > 0)]
        # logits span decades as they grow: a log colour scale from the smallest to the largest seen
        norm = (LogNorm(vmin=positive.min(), vmax=max(positive.max(), positive.min() * 10))
                if measure == "max_score" and positive.size else None)
        im = ax.imshow(grid, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
        ticks = range(0, len(steps), max(1, len(steps) // 8))
        ax.set_xticks(list(ticks), [str(steps[i]) for i in ticks])
        ax.set_yticks(range(L * H), head_labels(records), fontsize=7)
        ax.set(xlabel="step", ylabel="layer.head", title=f"{label}, every head over steps")
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        if norm is not None:  # a log bar labels its minor ticks as 6×10⁰: round numbers instead, written plainly
            bar.ax.minorticks_off()
            marks = round_ticks(norm.vmin, norm.vmax)
            bar.set_ticks(marks, labels=[f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in marks])
    return drawing.save(fig, path)


def round_ticks(lo: float, hi: float) -> list[float]:
    """Round numbers between ``lo`` and ``hi`` for a log colour bar: 1, 2 and 5 times a power of ten over up to
    two decades, the powers of ten alone (every other one past six) over more, else (a range too narrow to hold
    two of them) matplotlib's own round steps."""
    from matplotlib.ticker import MaxNLocator

    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1, 2, 5) if last - first <= 2 else (1,)
    marks = [m * 10.0 ** e for e in range(first, last + 1) for m in steps]
    marks = [t for t in marks if lo <= t <= hi]
    marks = marks[::2] if len(marks) > 6 else marks
    if len(marks) < 2:
        marks = [float(t) for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]
    return marks


def _over_steps(records, causal: bool, path: Path) -> Path:
    plt = drawing.pyplot()
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    steps = [r.step for r in records]
    names = sorted({a["alert"] for r in records for a in r.alerts})
    # the alerts' panel only where one fired: the section below says "No alert fired" in words
    fig, axes = plt.subplots(1, 3 if names else 2, figsize=(16 if names else 11, 4.3))
    ax1, ax2 = axes[:2]
    frozen = grid_over_steps(records, "frozen_fraction")
    H = records[-1].heads
    for layer in range(records[-1].layers):
        ax1.plot(steps, np.nanmean(frozen[layer * H:(layer + 1) * H], axis=0), lw=1.2, label=f"layer {layer}")
    ax1.plot(steps, [r.summary.get("attn/frozen_fraction", math.nan) for r in records], "k--", lw=1.5, label="model")
    ax1.set(xlabel="step", ylabel="share of rows frozen", title="Frozen share (mean of heads)", ylim=(-0.02, 1.02))
    ax1.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax1.legend(fontsize=7)
    pairs = [reference_words(r, causal) for r in records]
    ax2.plot(steps, [p[0] for p in pairs], "-", color="#2471a3", lw=1.6, label="measured (mean of heads)")
    ax2.plot(steps, [p[1] for p in pairs], "--", color="#888888", lw=1.2, label="random scores at each head's spread")
    ax2.set(xlabel="step", ylabel="effective words per row", title="Effective words beside random scores")
    ax2.legend(fontsize=7)
    for i, name in enumerate(names):
        hits = [(a["step"], a["layer"] * H + a["head"]) for r in records for a in r.alerts if a["alert"] == name]
        axes[2].scatter([s for s, _ in hits], [i + 0.6 * (lh / max(records[-1].layers * H, 1) - 0.5) for _, lh in hits],
                        s=10, label=name)
    if names:
        axes[2].set_yticks(range(len(names)), names)
        axes[2].set_xlim(min(steps) - 1, max(steps) + 1)
        axes[2].set(xlabel="step", title="Alerts (one mark per head and step)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    return drawing.save(fig, path)


def _number(x) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:,.4g}"


def _percent(x) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


# The model-wide numbers of a record, named as the README names the measures, each written as it reads: a share
# as a percent, a count of heads as a whole number. A key not here (a newer watch's) is shown by its own name.
SUMMARY = {
    "attn/max_score": ("max |score| (the largest of any head)", _number),
    "attn/min_effective_words": ("effective words (the fewest of any head)", _number),
    "attn/frozen_fraction": ("frozen share of rows (all heads)", _percent),
    "attn/collapsed_heads": ("heads under 2 effective words", _number),
    "attn/nonfinite_heads": ("heads that read NaN or inf", _number),
    "attn/alerts": ("alerts at this step", _number),
    "qk_clip/min_gamma": ("QK-Clip's smallest factor", _number),
    "qk_clip/clipped_heads": ("heads QK-Clip scaled down", _number),
}


def summary_rows(summary: dict) -> list[list[str]]:
    """The last probe's table: each measure's name, its value as it reads, and its key in the log."""
    rows = []
    for key, value in summary.items():
        name, written = SUMMARY.get(key, (key, _number))
        rows.append([name, written(value), key])
    return rows


def page(records: list[WatchLine], causal: bool = True, title: str = "Attention watch") -> tuple[list, dict[str, bytes]]:
    """(blocks, images) of the page; ``render.to_html`` makes it one file."""
    import tempfile

    last = records[-1]
    blocks = [Heading(1, title),
              Para(f"{len(records)} probe steps, {records[0].step} to {last.step}; {last.layers} layers × "
                    f"{last.heads} heads; probe of {last.probe.get('sequences', '?')} sequences × "
                    f"{last.probe.get('tokens', '?')} tokens; rows frozen above max weight {last.threshold}.")]
    watch = last.watch
    if watch:
        blocks.append(Para(f"The watch's own time: {watch.get('total_seconds', math.nan):.3g} s in all, "
                            f"{100 * watch.get('share', math.nan):.2f}% of the wall time since it started."))
    blocks.append(Heading(2, "The last probe"))
    blocks.append(Table(["measure", f"step {last.step}", "key in the log"], summary_rows(last.summary)))
    images = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, draw, caption in (("heads.png", lambda p: _heatmaps(records, p),
                                     "Every head over steps: effective words and max |score|"),
                                    ("steps.png", lambda p: _over_steps(records, causal, p),
                                     "Frozen share, effective words beside random scores, and alerts, over steps")):
            images[name] = draw(Path(tmp) / name).read_bytes()
            blocks += [Image(name, caption)]
    measured, expected = reference_words(last, causal)
    blocks.append(Para(f"At step {last.step} the heads spread over {measured:.3g} effective words on average; "
                        f"random scores at the same spreads would give {_number(expected)} "
                        f"({'causal' if causal else 'full'} rows of {last.probe.get('tokens', '?')} keys)."))
    blocks += _kinds_blocks(records)
    firings = first_firings(records)
    blocks.append(Heading(2, "Alerts"))
    if firings:
        blocks.append(Table(["step", "layer", "head", "alert", "value", "action"],
                       [[a["step"], a["layer"], a["head"], a["alert"], _number(a["value"]), a["action"]] for a in firings]))
    else:
        blocks.append(Para("No alert fired."))
    return blocks, images


def build(log: Path | str, out: Path | str | None = None, causal: bool = True, refresh: float | None = None,
          records: list[WatchLine] | None = None, read: WatchLog | None = None) -> Path:
    """Read the watch log ``log`` (or take its ``records``, or what ``read_watch_log`` made of it) and write the
    page of its last run to ``out`` (default: beside it, .html), in one atomic write; returns its path.
    ``refresh``: the page reloads itself every that many seconds. ``check_out`` first: nothing but a page of
    its own is ever replaced."""
    log = Path(log)
    out = Path(out) if out is not None else log.with_suffix(".html")
    check_out(log, out)
    notes: list[str] = []
    if records is None:
        read = read if read is not None else read_watch_log(log)
        notes, records = [n for n in [read.runs_note()] if n], read.last_run().records
    _check_drawn(records, log)
    blocks, images = page(records, causal=causal, title=f"Attention watch: {log.name}")
    blocks[1:1] = [Para(note) for note in notes]  # under the title: the page shows one run of several
    out.parent.mkdir(parents=True, exist_ok=True)
    html = render.to_html(blocks, images, refresh=refresh, generator="watch-report")
    atomic_write_bytes(out, html.encode("utf-8"))
    return out


def check_follow(log: Path | str, out: Path | str) -> None:
    """A ``ConfigError`` now for what ``follow`` could never read or write, before anything is said or waited
    for: ``check_out``'s cases, a folder, a log whose lines are not records (a log that is absent or
    without a complete record yet is waited for)."""
    log = Path(log)
    check_out(log, out)
    if log.is_dir():
        raise ConfigError(f"cannot follow {str(log)!r}: it is a folder; give the JSONL file a Watch writes")
    if log.exists():
        try:
            read_watch_log(log)
        except EmptyLogError:
            pass


def follow(log: Path | str, out: Path | str | None = None, causal: bool = True, every: float = 5.0,
           say=print, stop=lambda: False, give_up: float | None = None, warn=None) -> Path:
    """The page of a log that is still being written: built again whenever a record is added, checked every
    ``every`` seconds, the page reloading itself as often, until ``stop()``, Ctrl-C, or ``give_up`` seconds
    without a new record (None: never). A log not there yet, or without a complete record, is waited for and
    said once through ``warn`` (default ``say``); a last line caught half-written is read at the next check,
    the page kept as it was. What can never be read (a folder, a line that is not a record, a newer
    version) is a ``ConfigError`` at once; giving up before any page is one too."""
    log = Path(log)
    out = Path(out) if out is not None else log.with_suffix(".html")
    warn = say if warn is None else warn
    check_follow(log, out)
    seen, stat, told, runs, read, waiting = None, None, None, 1, None, None
    last_new = time.monotonic()
    try:
        while not stop():
            try:
                now = log.stat()
            except FileNotFoundError:  # not yet there, or moved away
                now = None
            if now is None:
                stat, waiting = None, f"waiting for {log} to appear"
            elif (now.st_size, now.st_mtime_ns) != stat:  # a week's log is parsed again only when it has changed
                stat = (now.st_size, now.st_mtime_ns)
                try:
                    read, waiting = read_watch_log(log), None
                except EmptyLogError:
                    waiting = f"waiting for the first record in {log}"
            if waiting is not None and waiting != told:
                warn(waiting)
                told = waiting
            if waiting is None:
                newest = (len(read.records), read.records[-1].step, read.records[-1].time)
                if newest != seen:
                    build(log, out, causal, refresh=every, read=read)
                    shown = read.last_run().records
                    say(f"page: {out} ({len(shown)} probe steps, the last at step {shown[-1].step})")
                    if len(read.runs()) != runs:
                        runs = len(read.runs())
                        warn(read.runs_note())
                    seen, last_new = newest, time.monotonic()
            if give_up is not None and time.monotonic() - last_new > give_up:
                return _given_up(log, out, give_up, read if seen is not None else None, waiting, warn)
            time.sleep(every)
    except KeyboardInterrupt:
        say(f"stopped following {log}; the page stays at {out}")
    return out


def _given_up(log: Path, out: Path, give_up: float, read: WatchLog | None, waiting: str | None, warn) -> Path:
    """The end of ``follow`` after ``give_up`` seconds without a new record: a message, or, where no page
    was ever built, a ``ConfigError``."""
    if read is None:
        what = "did not appear" if waiting and waiting.endswith("to appear") else "still holds no complete record"
        raise ConfigError(f"gave up following {str(log)!r}: it {what} in {give_up:g} s; check that the run writes "
                          "it (a Watch with a JsonlSink), or wait longer (--give-up)")
    cut = bool(read.cut) and read.cut[-1] > read.lines[-1]
    warn(f"stopped following {log}: no new record in {give_up:g} s"
         + ("; its last line is cut short, as a run killed while writing leaves it" if cut else "")
         + f"; the page stays at {out}")
    return out
