"""plots: each figure is written from plain values, and matplotlib loads only when one is drawn."""

from __future__ import annotations

import subprocess
import sys

from test_report import _diag, _fresh_row, _illustration, _spread_rows

from attnscale.report import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path) -> bool:
    return path.exists() and path.read_bytes()[:8] == PNG and path.stat().st_size > 5_000


def test_every_figure_is_a_png(tmp_path):
    fresh = [_fresh_row(i, d, s) for i in ("unit", "model") for d in (4, 64, 1024) for s in ("none", "inv_sqrt_d")]
    steps = [{"step": s, "loss": 5 - s / 10, "lr": 1e-3, **_diag(s, 3 + s, s / 10, 30 - s)} for s in range(0, 11, 5)]
    steps.append({"step": 10, "valid_loss": 4.2})
    cells = {(32, "none"): [40.0, 40.2], (32, "inv_sqrt_d"): [40.1], (256, "none"): [57.0], (256, "inv_sqrt_d"): [40.0]}
    made = [
        plots.spread_plot(_spread_rows(), tmp_path / "spread.png"),
        plots.fresh_plot(fresh, tmp_path / "fresh.png"),
        plots.illustration(_illustration(), tmp_path / "ill.png"),
        plots.training([("none s0", "none", steps), ("inv_sqrt_d s0", "inv_sqrt_d", steps)], tmp_path / "t.png", "t"),
        plots.perplexity_vs_width(cells, {32: (0.05, None, 1), 256: (17.0, None, 1)}, 256, tmp_path / "ppl.png"),
    ]
    assert all(_is_png(p) for p in made)


def test_matplotlib_loads_only_when_drawing():
    code = "import sys, attnscale.report.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
