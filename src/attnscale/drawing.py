"""matplotlib, loaded only when a figure is drawn, and the one way a figure becomes a PNG.

``import attnscale`` stays free of matplotlib (it is an extra, ``attnscale[report]``):
``pyplot()`` loads it with the Agg backend, so no display is needed, or says in one
line how to install it. ``save`` writes at ``DPI`` with no software stamp in the
metadata, so a rebuilt figure is the same bytes. The report's plots, the watch
page and the heatmaps of ``attnscale inspect`` all draw through here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DPI", "pyplot", "save"]

DPI = 110


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend; a ConfigError naming the extra where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        from attnscale.errors import ConfigError

        raise ConfigError("plots need matplotlib; install the extra: pip install -e '.[report]' in the clone") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, rect=(0, 0, 1, 1)) -> Path:
    """Lay ``fig`` out inside ``rect`` (room kept for a legend below it), write it to ``path`` as a PNG, close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    # metadata=None-equivalents keep the PNG bytes stable across rebuilds
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    pyplot().close(fig)
    return path
