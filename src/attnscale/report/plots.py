"""The report's figures, drawn from values read out of run records.

matplotlib loads inside each function (``attnscale.drawing``: the Agg backend,
so no display is needed): ``import attnscale`` must stay free of it, and it is
an extra (``attnscale[report]``). Each function writes one PNG and returns its path.
Colours follow the scale scheme everywhere, so a reader learns them once, and
schemes are named as readers see them (``core.scales.display_name``).

Legible where shown: no text is smaller than ``MIN_FONT_PT`` (9 pt, 13.75 px of the
PNG at ``DPI``), and the page never shows a figure narrower than
``SMALLEST_SHOWN`` of its width, where that text is still ``SCREEN_TEXT_PX`` (9 px)
on screen; a legend with many entries sits outside the axes, and schemes whose
curves would lie on top of each other get a panel each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscale import drawing
from attnscale.drawing import DPI

__all__ = ["spread_plot", "fresh_plot", "illustration", "training", "perplexity_vs_head_dim", "end_spread_by_setup",
           "scheme_colour"]

_COLOURS = {"none": "#c0392b", "inv_sqrt_d": "#2471a3", "inv_d": "#7d3c98", "qk_norm": "#1e8449",
            "softcap": "#b9770e", "learned_temp": "#566573"}
MIN_FONT_PT = 9  # every text of every figure, ticks and legends included
SCREEN_TEXT_PX = 9  # the least a reader should have to read on screen
SMALLEST_SHOWN = SCREEN_TEXT_PX * 72 / (MIN_FONT_PT * DPI)  # ≈ 0.65: the narrowest a figure may be shown
SMALL = MIN_FONT_PT


def _name(scale: str) -> str:
    from attnscale.core.scales import display_name

    return display_name(scale)


def scheme_colour(scale: str) -> str:
    return _COLOURS.get(scale, "#333333")


def _shade(colour: str, i: int, n: int) -> str:
    """The ``i``-th of ``n`` shades of ``colour``, from itself towards white: layers of one run
    differ in colour as well as in line style."""
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    mix = 0.55 * i / max(n - 1, 1)
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _log2_head_dims(ax, head_dims: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(head_dims))
    ax.set_xticklabels([str(w) for w in head_dims])
    ax.minorticks_off()


def _plain_log_y(ax, ticks: Sequence[float]) -> None:
    """A log y axis labelled 1, 2, 5, … rather than 10^0: readers compare with the course's plain numbers."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    shown = [t for t in ticks if lo <= t <= hi]
    ax.set_yticks(shown)
    ax.set_yticklabels([f"{t:,g}" for t in shown])
    ax.minorticks_off()


def spread_plot(rows: list[dict], path: Path) -> Path:
    """Raw and scaled spread of q·k against width, log–log, with the √d line."""
    plt = drawing.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    raw = sorted({int(r["head_dim"]): float(r["raw_spread"]) for r in rows}.items())
    head_dims = [w for w, _ in raw]
    fine = [2 ** (k / 8) for k in range(int(8 * math.log2(min(head_dims))) - 4, int(8 * math.log2(max(head_dims))) + 5)]
    ax.plot(fine, [math.sqrt(w) for w in fine], color="#888888", lw=1, ls="--", label="√d")
    ax.axhline(1.0, color="#888888", lw=0.8, ls=":")
    ax.plot(head_dims, [v for _, v in raw], "o-", color=scheme_colour("none"), label="raw q·k (no scale)")
    for scale in sorted({r["scale"] for r in rows if r.get("scale") != "none"}):
        pts = sorted((int(r["head_dim"]), float(r["scaled_spread"])) for r in rows if r.get("scale") == scale)
        ax.plot([w for w, _ in pts], [v for _, v in pts], "s-", color=scheme_colour(scale), label=f"scaled ({_name(scale)})")
    _plain_log_y(ax, [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256])
    _log2_head_dims(ax, head_dims)
    ax.set_xlabel("width d (entries of q and k)")
    ax.set_ylabel("spread (std of scores)")
    ax.set_title(f"Spread of scores over {rows[0].get('pairs', 0):,} random pairs")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    return drawing.save(fig, path)


def fresh_plot(rows_list: list[dict], path: Path) -> Path:
    """Effective words (median, p10–p90 band) and frozen fraction against width, per init and scale."""
    plt = drawing.pyplot()
    rows = {(r.get("init", "unit"), int(r["head_dim"]), r["scale"]): r for r in rows_list}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.3))
    head_dims = sorted({w for _, w, _ in rows})
    styles = {"unit": ("-", "o"), "model": (":", "^")}
    for init in sorted({i for i, _, _ in rows}, key=lambda i: (i != "unit", i)):
        ls, mk = styles.get(init, ("--", "x"))
        for scale in sorted({s for i, _, s in rows if i == init}):
            pts = sorted((w, r) for (i, w, s), r in rows.items() if i == init and s == scale)
            ws = [w for w, _ in pts]
            c = scheme_colour(scale)
            label = f"{_name(scale)}, {init} init"
            ax1.plot(ws, [r["effective_words_median"] for _, r in pts], ls=ls, marker=mk, color=c, label=label)
            ax1.fill_between(ws, [r["effective_words_p10"] for _, r in pts], [r["effective_words_p90"] for _, r in pts],
                             color=c, alpha=0.12 if init == "unit" else 0.06)
            ax2.plot(ws, [100 * r["frozen_fraction"] for _, r in pts], ls=ls, marker=mk, color=c, label=label)
    words = next(iter(rows.values())).get("words", 64)
    ax1.set_ylabel(f"effective words per row (of {words}); band p10–p90")
    _plain_log_y(ax1, [1, 2, 5, 10, 20, 50, 100, 200, 500])
    threshold = next(iter(rows.values())).get("frozen_threshold", 0.99)
    ax2.set_ylabel(f"frozen rows, % (max weight > {threshold})")
    ax2.set_ylim(-3, 103)
    for ax in (ax1, ax2):
        _log2_head_dims(ax, head_dims)
        ax.set_xlabel("width d")
        ax.grid(alpha=0.3)
    ax1.set_title("A fresh head: how many words a row spreads over")
    ax2.set_title("A fresh head: rows frozen on one word")
    ax1.legend(fontsize=SMALL)
    ax2.legend(fontsize=SMALL)
    return drawing.save(fig, path)


def illustration(ill: dict[str, Any], path: Path) -> Path:
    """One row's weights at several score scales: from a soft blend to one word."""
    plt = drawing.pyplot()
    mults, weights = ill["multipliers"], ill["weights"]
    eff = ill.get("effective_words") or [None] * len(mults)
    n = len(mults)
    # a grid with no empty panel: one row up to 5, else the widest divisor of n up to 5 (a prime: one row)
    cols = n if n <= 5 else next((c for c in (5, 4, 3) if n % c == 0), n)
    rows = n // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 0.4, 2.7 * rows), sharey=True, squeeze=False)
    for ax, m, w, e in zip(axes.flat, mults, weights, eff):
        ax.bar(range(len(w)), w, color=scheme_colour("inv_sqrt_d"), width=0.9)
        title = f"scores × {m:g}"
        if e is not None:  # two lines: a panel is narrow, and its title must stay at full size
            title += f"\n{e:.1f} effective words"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("word")
    for ax in axes[:, 0]:
        ax.set_ylabel("weight")
    fig.suptitle("The same row of scores, made louder", fontsize=11)
    return drawing.save(fig, path)


def _layer_means(steps: list[dict], key: str) -> tuple[list[int], list[list[float]]]:
    """Steps, and per layer the mean over heads of ``key`` at each step."""
    xs = [s["step"] for s in steps]
    n_layers = len(steps[0]["layers"])
    from attnscale.core.diagnostics import reduce_heads

    per = [[reduce_heads([s["layers"][i][key]]) for s in steps] for i in range(n_layers)]
    return xs, per


def _differ(per: list[list[float]]) -> bool:
    if len(per) < 2:
        return False
    for vals in zip(*per):
        lo, hi = min(vals), max(vals)
        if hi - lo > 0.1 * max(abs(hi), 1e-9) and hi - lo > 1e-3:
            return True
    return False


def training(runs: list[tuple[str, str, list[dict]]], path: Path, title: str,
             targets: dict[str, list[tuple[float, str, str]]] | None = None) -> Path:
    """Spread, frozen fraction, effective words and loss per step; ``runs`` = [(label, scale, metric lines)].

    Thick: mean over layers and heads. Thin lines: each layer (mean over its
    heads) in a lighter shade of the run's colour and its own dash, drawn only
    where the layers differ by more than 10%. One legend for the four panels.
    ``targets[measure]`` = [(value, label, scale)]: the course's figures, drawn as
    dashed lines in the scheme's colour and named where they end (frozen share as a
    fraction, drawn in %)."""
    plt = drawing.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [("spread", "spread of scaled scores"), ("frozen_fraction", "frozen rows, %"),
              ("effective_words", "effective words per row")]
    for label, scale, steps in runs:
        c = scheme_colour(scale)
        diag = [s for s in steps if s.get("layers")]
        if diag:
            for ax, (key, ylabel) in zip(axes.flat, panels):
                xs, per = _layer_means(diag, key)
                k = 100 if key == "frozen_fraction" else 1
                mean = [k * sum(v) / len(v) for v in zip(*per)]
                ax.plot(xs, mean, color=c, lw=2, label=label)
                if _differ(per):
                    for i, ys in enumerate(per):
                        ax.plot(xs, [k * y for y in ys], color=_shade(c, i + 1, len(per) + 1), lw=1,
                                ls=(0, (1 + 2 * i, 1 + i)), label=f"{label}, layer {i}")
                ax.set_ylabel(ylabel)
        loss = [(s["step"], s["loss"]) for s in steps if s.get("loss") is not None]
        if loss:
            axes[1, 1].plot([x for x, _ in loss], [y for _, y in loss], color=c, lw=1.2, label=f"{label} (train)")
        ev = [(s["step"], s["valid_loss"]) for s in steps if s.get("valid_loss") is not None]
        if ev:
            axes[1, 1].plot([x for x, _ in ev], [y for _, y in ev], "o--", color=c, ms=4, label=f"{label} (held out)")
    axes[1, 1].set_ylabel("loss (nats per token)")
    where = {key: ax for ax, (key, _) in zip(axes.flat, panels)}
    for key, marks in (targets or {}).items():
        ax = where[key]
        if not ax.lines:
            continue
        for value, text, scale in marks:
            y = 100 * value if key == "frozen_fraction" else value
            # nolegend: a target is named on the plot, beside its line, not among the runs
            ax.axhline(y, color=scheme_colour(scale), lw=1, ls=(0, (5, 3)), alpha=0.8, label="_nolegend_")
            # named just under its line: a target at the top of the axis keeps its label inside
            ax.annotate(text, (0.01, y), xycoords=("axes fraction", "data"), xytext=(0, -2), textcoords="offset points",
                        fontsize=SMALL, va="top", color=scheme_colour(scale))
    if axes[0, 0].lines:  # the spread runs from ~1 to thousands without the scale
        _plain_log_y(axes[0, 0], [k * 10.0 ** e for e in range(-2, 6) for k in (1, 2, 5)])
    from matplotlib.ticker import MaxNLocator

    legend: dict[str, Any] = {}
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, len(legend)), fontsize=SMALL,
                   frameon=False)
    fig.suptitle(title, fontsize=11)
    rows = math.ceil(len(legend) / 4)
    return drawing.save(fig, path, rect=(0, 0.035 * rows + 0.01, 1, 1))


def perplexity_vs_head_dim(cells: dict[tuple[int, str], list[float]], gaps: dict[int, tuple[float, float | None, int]],
                        start: int | None, path: Path) -> Path:
    """Held-out perplexity against width per scheme (mean, min–max of seeds), and the gap."""
    plt = drawing.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.3))
    head_dims = sorted({w for w, _ in cells})
    seeds = max((len(v) for v in cells.values()), default=0)
    for scale in sorted({s for _, s in cells}):
        pts = sorted((w, v) for (w, s), v in cells.items() if s == scale and v)
        ws = [w for w, _ in pts]
        mean = [sum(v) / len(v) for _, v in pts]
        err = [[m - min(v) for m, (_, v) in zip(mean, pts)], [max(v) - m for m, (_, v) in zip(mean, pts)]]
        ax1.errorbar(ws, mean, yerr=err if seeds > 1 else None, marker="o", capsize=3, color=scheme_colour(scale),
                     label=_name(scale))
    # the axis and legends promise bars only where there are some
    ax1.set_ylabel("held-out perplexity" + (" (bars: seeds' min–max)" if seeds > 1 else " (one seed: no bars)"))
    ax1.set_title("Perplexity by width")
    ax1.legend()
    if gaps:
        gw = sorted(gaps)
        has_se = any(gaps[w][1] is not None for w in gw)
        ax2.errorbar(gw, [gaps[w][0] for w in gw], yerr=[3 * (gaps[w][1] or 0) for w in gw] if has_se else None,
                     marker="o", capsize=3, color="#444444",
                     label=f"ppl({_name('none')}) − ppl({_name('inv_sqrt_d')})"
                     + ("; bars 3 SE" if has_se else "; one seed, no bars"))
        ax2.axhline(0, color="#888888", lw=0.8)
        if start is not None:
            ax2.axvline(start, color=scheme_colour("inv_sqrt_d"), ls="--", lw=1, label=f"gap starts (d={start})")
        ax2.legend(fontsize=SMALL)
    ax2.set_ylabel("perplexity gap (points)")
    ax2.set_title("What the scale is worth")
    for ax in (ax1, ax2):
        if head_dims:
            _log2_head_dims(ax, head_dims)
        ax.set_xlabel("width d")
        ax.grid(alpha=0.3)
    return drawing.save(fig, path)


# ---- the scale-scheme study ("Beyond the course: which scale?") ----------------------

__all__ += ["loss_vs_lr", "sensitivity_vs_head_dim", "max_logit_over_steps", "random_score_overlay"]


def _log_lrs(ax, lrs: Sequence[float]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(list(lrs))
    ax.set_xticklabels([f"{lr:g}" for lr in lrs], fontsize=SMALL)
    ax.minorticks_off()


def loss_vs_lr(curves: dict[int, dict[str, list[dict]]], path: Path) -> Path:
    """Final held-out loss against learning rate: a panel per scheme and width (schemes' curves
    often lie on top of each other, so each gets its own panel, the others faint behind it),
    a band of ± 1 SE over seeds; a cross marks a learning rate where some seed diverged.
    ``curves[width][scheme]`` = [{"lr", "mean", "se", "diverged"}] (``analysis.schemes.loss_curve``)."""
    plt = drawing.pyplot()
    head_dims = sorted(curves)
    most = max(len(curves[w]) for w in head_dims)
    cols = min(3, most)
    per_head_dim = math.ceil(most / cols)
    fig, axes = plt.subplots(per_head_dim * len(head_dims), cols, figsize=(3.7 * cols + 0.6, 2.9 * per_head_dim * len(head_dims) + 0.7),
                             sharey=True, squeeze=False)

    def points(pts):
        ok = [p for p in pts if p["mean"] is not None]
        return [p["lr"] for p in ok], [p["mean"] for p in ok], [p["se"] or 0.0 for p in ok]

    for k, head_dim in enumerate(head_dims):
        lrs = sorted({c["lr"] for pts in curves[head_dim].values() for c in pts})
        cells = [ax for row in axes[k * per_head_dim:(k + 1) * per_head_dim] for ax in row]
        for ax, (scale, pts) in zip(cells, curves[head_dim].items()):
            for other, their in curves[head_dim].items():  # the others, faint: where this one sits among them
                if other != scale:
                    xs, ys, _ = points(their)
                    ax.plot(xs, ys, "-", color="#bbbbbb", lw=1)
            c = scheme_colour(scale)
            xs, ys, se = points(pts)
            ax.plot(xs, ys, "o-", color=c, ms=4)
            ax.fill_between(xs, [y - e for y, e in zip(ys, se)], [y + e for y, e in zip(ys, se)], color=c, alpha=0.2)
            bad = [p["lr"] for p in pts if p["diverged"]]
            if bad:
                top = max(ys) if ys else 0.0
                ax.plot(bad, [top] * len(bad), "x", color=c, ms=9, mew=2)
            _log_lrs(ax, lrs)
            ax.set_title(f"{_name(scale)}, d = {head_dim}", color=c, fontsize=10)
            ax.grid(alpha=0.3)
        for ax in cells[len(curves[head_dim]):]:
            ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("peak learning rate")
    for row in axes:
        row[0].set_ylabel("held-out loss (nats)")
    fig.suptitle("Final loss against learning rate (band ± 1 SE over seeds; grey: the other schemes; "
                 "× : a seed diverged)", fontsize=10)
    return drawing.save(fig, path)


def sensitivity_vs_head_dim(points: dict[str, list[tuple[int, float, float | None]]], path: Path) -> Path:
    """Learning-rate sensitivity against head width, per scheme: ``points[scheme]`` = [(width, mean, SE or None)]."""
    plt = drawing.pyplot()
    fig, ax = plt.subplots(figsize=(8.6, 4.3))
    head_dims = sorted({w for pts in points.values() for w, _, _ in pts})
    n = max(1, len(points))
    for k, (scale, pts) in enumerate(points.items()):
        pts = sorted(pts)
        nudge = 2 ** (0.04 * (k - (n - 1) / 2))  # side by side, so error bars do not hide each other
        ax.errorbar([w * nudge for w, _, _ in pts], [m for _, m, _ in pts], yerr=[e or 0.0 for _, _, e in pts],
                    marker="o", capsize=3, color=scheme_colour(scale), label=_name(scale))
    _log2_head_dims(ax, head_dims)
    ax.set_xlabel("head width d")
    ax.set_ylabel("LR sensitivity (nats); bars ± 1 SE")
    ax.set_title("How much a bad learning rate costs, by width")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # outside: no curve hidden
    return drawing.save(fig, path)


def max_logit_over_steps(panels: dict[str, dict[str, list[tuple[int, float]]]], path: Path, title: str) -> Path:
    """Max |attention logit| per recorded step, per scheme: ``panels[panel title][scheme]`` = [(step, value)]."""
    plt = drawing.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 2.2, 4.3), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        for scale, pts in series.items():
            pts = [(s, v) for s, v in pts if math.isfinite(v)]
            ax.plot([s for s, _ in pts], [max(v, 1e-3) for _, v in pts], "-", color=scheme_colour(scale), lw=1.6,
                    label=_name(scale))
        if ax.lines:
            _plain_log_y(ax, [k * 10.0 ** e for e in range(-1, 6) for k in (1, 2, 5)])
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("max |scaled score| over layers and heads")
    axes[0][-1].legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.suptitle(title, fontsize=11)
    return drawing.save(fig, path)


def random_score_overlay(theory: dict[str, Any], path: Path) -> Path:
    """Effective words against spread with the random-Gaussian-score curve (``core.gaussian_scores``), each
    curve the statistic its points are: fresh heads (n words, every row sees all; the median row against the
    median row of random scores), trained heads (causal rows of the context; a head's mean over rows against
    E[exp H] over causal rows), and mean effective words over training beside what the same spread predicts.
    Trained heads sit at their pooled spread (all their scores together), which also counts differences
    between rows' mean scores that softmax ignores: it is at or above what the rows see, so a head above the
    curve may be at random level by its rows' own spread, while one below it is below at either.

    ``theory``: {"fresh": [(scheme, spread, eff. words, n)], "trained": {scheme: [(spread, eff. words, step)]},
    "steps": {scheme: [(step, mean spread, mean eff. words, mean of each head's prediction)]}, "width", "lr",
    "context"}.
    One legend below the panels: a colour per scheme, named once, and what each line style means."""
    import numpy as np
    from matplotlib.lines import Line2D

    from attnscale.core.gaussian_scores import expected_effective_words

    plt = drawing.pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 5.2))
    grid = np.concatenate([np.linspace(0, 4, 81), np.geomspace(4.05, 400, 80)])
    schemes: dict[str, None] = {}
    if theory["fresh"]:
        n = theory["fresh"][0][3]
        # the fresh experiment reports the median row: the curve is the median row's too
        ax1.plot(np.maximum(grid, 0.05), expected_effective_words(grid, n, statistic="median"), color="#888888", lw=1.5)
        for scale in dict.fromkeys(s for s, *_ in theory["fresh"]):
            schemes[scale] = None
            pts = sorted((sp, ew) for s, sp, ew, _ in theory["fresh"] if s == scale)
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=scheme_colour(scale))
        ax1.set_title(f"Fresh heads (unit init), {n} keys:\nmedian row, against the median row of random scores",
                      fontsize=10)
    else:
        ax1.text(0.5, 0.5, "no fresh-head record (attnscale fresh)", ha="center", va="center", transform=ax1.transAxes)
    context = theory.get("context")
    if context:
        curve = expected_effective_words(grid, context, causal=True)  # E[exp H] over rows: a head's own mean
        ax2.plot(np.maximum(grid, 0.05), curve, color="#888888", lw=1.5)
        for scale, pts in theory["trained"].items():
            schemes[scale] = None
            ax2.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.35, color=scheme_colour(scale))
        ax2.set_title(f"Trained heads, every recorded step (d = {theory['head_dim']}, lr {theory['lr']:g},\ncausal, "
                      f"{context} keys), mean row, at the head's pooled spread", fontsize=10)
        for scale, pts in theory["steps"].items():
            schemes[scale] = None
            c = scheme_colour(scale)
            ax3.plot([p[0] for p in pts], [p[2] for p in pts], "-", color=c, lw=1.6)
            ax3.plot([p[0] for p in pts], [p[3] for p in pts], "--",
                     color=c, lw=1)
        ax3.set_title("Effective words over training\n(first seed, mean of heads)", fontsize=10)
        ax3.set_xlabel("step")
        ax3.set_ylabel("effective words per row")
        ax3.grid(alpha=0.3)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlim(0.05, 400)
        ax.set_xlabel("spread of scaled scores")
        ax.set_ylabel("effective words per row")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=scheme_colour(s), marker="o", lw=2, label=_name(s)) for s in schemes]
    handles += [Line2D([], [], color="#888888", lw=1.5, label="random scores (left, middle)"),
                Line2D([], [], color="#444444", lw=1.6, label="measured (right)"),
                Line2D([], [], color="#444444", lw=1, ls="--", label="random scores at each head's spread (right)")]
    cols = min(5, len(handles))
    fig.legend(handles=handles, loc="lower center", ncol=cols, fontsize=SMALL, frameon=False)
    return drawing.save(fig, path, rect=(0, 0.06 * math.ceil(len(handles) / cols) + 0.01, 1, 1))


def end_spread_by_setup(panels: dict[str, list[tuple[str, dict[str, tuple[float | None, float | None]]]]],
                        lines: dict[str, tuple[float, str]], path: Path, title: str) -> Path:
    """End-of-training spread against each axis of the setup study, one panel per axis.

    ``panels[axis name]`` = [(value label, {scheme: (mean, SE or None)})] in the axis's order,
    the base's value among them; ``lines[label]`` = (y, scheme): the course's figures."""
    plt = drawing.pyplot()
    cols = min(3, max(1, len(panels)))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 0.4, 3.4 * rows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (name, points) in zip(flat, panels.items()):
        xs = list(range(len(points)))
        scales = list(dict.fromkeys(s for _, cells in points for s in cells))
        for k, scale in enumerate(scales):
            nudge = 0.06 * (k - (len(scales) - 1) / 2)
            pts = [(x + nudge, *cells[scale]) for x, (_, cells) in zip(xs, points)
                   if scale in cells and cells[scale][0] is not None and cells[scale][0] > 0]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] or 0.0 for p in pts], marker="o",
                            capsize=3, color=scheme_colour(scale), label=_name(scale))
        for label, (y, scale) in lines.items():
            ax.axhline(y, color=scheme_colour(scale), lw=0.8, ls="--", alpha=0.7)
            ax.text(xs[-1] + 0.3 if xs else 0, y, label, fontsize=SMALL, va="bottom", ha="right",
                    color=scheme_colour(scale))
        ax.set_xticks(xs, [v for v, _ in points], fontsize=SMALL)
        ax.set_xlim(-0.5, len(xs) - 0.5 + 0.3)
        if ax.lines or ax.collections:
            _plain_log_y(ax, [k * 10.0 ** e for e in range(-1, 6) for k in (1, 2, 5)])
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    flat[0].set_ylabel("spread at the end (mean over heads)")
    flat[0].legend(fontsize=SMALL)
    fig.suptitle(title, fontsize=11)
    return drawing.save(fig, path)
