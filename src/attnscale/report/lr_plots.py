"""The learning-rate study's figure (docs/lr-study.md): final held-out loss against learning rate, a panel per
optimizer and width, a line per treatment, drawn from the published "sensitivity" block alone.

Each line is the seed-mean of min(loss, floor), the quantity the study's endpoints read; each seed is a dot beside
it, and a seed that broke mid-run or never learnt is a cross at its loss (or at the floor where it has none). The
floor (a model whose attention learns nothing) is a dashed line. Lines that coincide (``alarm-clip`` is the ``none``
run wherever its alarm never fired) are drawn dashed over solid so that both stay visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscale import drawing
from attnscale.analysis.sensitivity import capped
from attnscale.report.plots import SMALL, _log_lrs

__all__ = ["TREATMENT_COLOURS", "loss_against_rate"]

# none and qk-norm as the schemes they are (1/sqrt(d) blue, qk-norm green); the actions in their own colours
TREATMENT_COLOURS = {"none": "#2471a3", "qk-norm": "#1e8449", "clip": "#b9770e", "alarm-clip": "#7d3c98",
                     "z-loss": "#566573"}
_STYLE = {"alarm-clip": (0, (4, 3)), "z-loss": (0, (1, 2))}


def loss_against_rate(groups: list[dict[str, Any]], path: Path) -> Path:
    """One panel per (optimizer, width) of ``groups`` (the "sensitivity" block's), written to ``path`` as a PNG."""
    if not groups:
        from attnscale.errors import ConfigError

        raise ConfigError("no finished lr-study group to draw: train a block first")
    plt = drawing.pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups) + 0.4, 4.4), squeeze=False)
    for ax, g in zip(axes[0], groups):
        floor = next(iter(g["curves"].values()))["floor"]
        lrs = sorted({p["lr"] for c in g["curves"].values() for p in c["per_rate"]})
        order = {t: i for i, t in enumerate(TREATMENT_COLOURS)}  # the study's order: none first, under the others
        for k, (t, c) in enumerate(sorted(g["curves"].items(), key=lambda tc: order.get(tc[0], len(order)))):
            colour = TREATMENT_COLOURS.get(t, "#000000")
            pts = [p for p in c["per_rate"] if p["mean"] is not None]
            ax.plot([p["lr"] for p in pts], [p["mean"] for p in pts], marker="o", color=colour, ms=4, lw=1.6,
                    ls=_STYLE.get(t, "-"), label=t, zorder=3 + k)
            for p in c["per_rate"]:
                x = p["lr"] * 1.04 ** (k - 2)  # each treatment's seeds a little apart
                failed = {str(s) for s in p["failed_seeds"]}
                for seed, v in p["losses"].items():
                    bad = str(seed) in failed
                    ax.plot([x], [capped(v, floor)], "x" if bad else ".", color=colour, ms=6 if bad else 4,
                            alpha=0.6, zorder=2)
        ax.axhline(floor, color="#888888", ls="--", lw=1)
        ax.text(lrs[0], floor, f" floor {floor:.2f}", va="bottom", ha="left", fontsize=SMALL, color="#555555")
        _log_lrs(ax, lrs)
        state = "interim" if g.get("interim") else "seeds " + ", ".join(
            str(s) for s in next(iter(g["curves"].values()))["seeds"])
        ax.set_title(f"{g['optimizer']}, d_model {g['d_model']} ({state})", fontsize=10)
        ax.set_xlabel("peak learning rate", fontsize=SMALL)
        ax.tick_params(labelsize=SMALL)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final held-out loss (nats), min(loss, floor)", fontsize=SMALL)
    handles, labels = {}, []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=len(labels), fontsize=SMALL,
               frameon=False)
    fig.suptitle("Final loss against learning rate: line, the seed mean; dot, a seed; ×, a seed that broke mid-run "
                 "or never learnt", fontsize=10)
    return drawing.save(fig, path, rect=(0, 0.07, 1, 1))
