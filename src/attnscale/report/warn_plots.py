"""The figures of the section "Warning before the break" (``warn_section``), drawn from the study's numbers.

Each function writes one PNG through ``attnscale.drawing`` and returns its path; matplotlib loads inside.
Every point drawn from runs carries its uncertainty: a Wilson interval for a rate, a percentile bootstrap
interval over seeds for a lead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from attnscale import drawing
from attnscale.report.plots import MIN_FONT_PT

__all__ = ["curves", "leads", "example_run", "COLOURS"]

COLOURS = {"max_score": "#c0392b", "growth": "#e67e22", "fewest_words": "#2471a3", "frozen": "#7d3c98",
           "head_spike": "#1e8449", "non_finite": "#566573", "loss_spike": "#000000", "combined": "#b9770e",
           "former defaults": "#b9770e", "max_score>1000": "#c0392b", "grad_norm_spike": "#1e8449",
           "log_z_drift": "#7d3c98"}


def _style(plt) -> None:
    plt.rcParams.update({"font.size": MIN_FONT_PT + 1, "legend.fontsize": MIN_FONT_PT, "xtick.labelsize": MIN_FONT_PT,
                         "ytick.labelsize": MIN_FONT_PT})


def curves(detectors: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path:
    """Per detector, (false-alarm rate, hit rate) over its thresholds on the held-out seeds; the chosen
    threshold's point with its Wilson intervals on both axes."""
    plt = drawing.pyplot()
    _style(plt)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    for name, d in detectors.items():
        pts = [p for p in d["curve_held_out"] if p["hit_rate"] is not None and p["false_alarm_rate"] is not None]
        if not pts:
            continue
        pts = sorted(pts, key=lambda p: (p["false_alarm_rate"], p["hit_rate"]))
        colour = COLOURS.get(name, "#333333")
        ax.plot([p["false_alarm_rate"] for p in pts], [p["hit_rate"] for p in pts], "-o", color=colour, ms=3, lw=1.2,
                label=name)
        w = d.get("warn")
        if w and w["hit_rate"] is not None and w["false_alarm_rate"] is not None:
            xe = _err(w["false_alarm_rate"], w["false_alarm_rate_ci"])
            ye = _err(w["hit_rate"], w["hit_rate_ci"])
            ax.errorbar([w["false_alarm_rate"]], [w["hit_rate"]], xerr=xe, yerr=ye, fmt="s", color=colour, ms=7,
                        mfc="white", capsize=3)
    ax.plot([0, 1], [0, 1], ":", color="#999999", lw=1, label="chance")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("false-alarm rate (healthy runs with any alarm)")
    ax.set_ylabel("hit rate (broken runs warned at or before the break)")
    ax.set_title(title, fontsize=MIN_FONT_PT + 1)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return drawing.save(fig, path)


def _err(value: float, ci: Sequence[float] | None):
    if not ci:
        return None
    return [[max(0.0, value - ci[0])], [max(0.0, ci[1] - value)]]


def leads(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Each rule's median lead (steps before the break) on its held-out hits, with the bootstrap interval
    (thick) and the quartiles (thin); ``rows``: {"name", "lead_median", "lead_median_ci", "lead_q1", "lead_q3", "hits"}."""
    plt = drawing.pyplot()
    _style(plt)
    rows = [r for r in rows if r["lead_median"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(rows) + 1.6))
    for i, r in enumerate(rows):
        colour = COLOURS.get(r["key"], "#333333")
        ax.plot([r["lead_q1"], r["lead_q3"]], [i, i], "-", color=colour, lw=1)
        if r["lead_median_ci"]:
            ax.plot(list(r["lead_median_ci"]), [i, i], "-", color=colour, lw=4, alpha=0.6)
        ax.plot([r["lead_median"]], [i], "o", color=colour, ms=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['name']} ({r['hits']} hits)" for r in rows])
    ax.axvline(0, color="#999999", lw=1, ls=":")
    ax.set_xlabel("lead, steps before the break (dot: median; thick: 95% bootstrap; thin: quartiles)")
    ax.set_title(title, fontsize=MIN_FONT_PT + 1)
    ax.invert_yaxis()
    return drawing.save(fig, path)


def example_run(series, marks: Mapping[str, int | None], broken_at: int | None, path: Path, title: str) -> Path:
    """One run over steps: the training loss, the largest max |score| and the fewest effective words of any
    head at each probe; each rule's first alarm and the break as vertical lines."""
    plt = drawing.pyplot()
    _style(plt)
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 6.4), sharex=True)
    steps = [i for i, x in enumerate(series.losses) if x is not None]
    axes[0].plot(steps, [series.losses[i] for i in steps], color="#000000", lw=0.8)
    axes[0].set_ylabel("training loss")
    ps = [s for s, _ in series.probes]
    axes[1].plot(ps, [max(m["max_score"]) for _, m in series.probes], color=COLOURS["max_score"], lw=1)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("max |score|")
    axes[2].plot(ps, [min(m["effective_words"]) for _, m in series.probes], color=COLOURS["fewest_words"], lw=1)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("fewest eff. words")
    axes[2].set_xlabel("step")
    for ax in axes:
        for name, step in marks.items():
            if step is not None:
                ax.axvline(step, color=COLOURS.get(name, "#333333"), lw=1.2, ls="--")
        if broken_at is not None:
            ax.axvline(broken_at, color="#000000", lw=2, alpha=0.5)
    handles = [plt.Line2D([], [], color=COLOURS.get(n, "#333333"), ls="--", label=f"{n}: first alarm {s}")
               for n, s in marks.items() if s is not None]
    if broken_at is not None:
        handles.append(plt.Line2D([], [], color="#000000", lw=2, alpha=0.5, label=f"break at {broken_at}"))
    axes[0].legend(handles=handles, loc="upper right", frameon=False)
    axes[0].set_title(title, fontsize=MIN_FONT_PT + 1)
    return drawing.save(fig, path)
