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


def _capture(monkeypatch):
    """The figures the plot functions draw, kept before they are closed."""
    figs = []
    save = plots._save

    def keep(fig, path, rect=(0, 0, 1, 1)):
        figs.append(fig)
        return save(fig, path, rect)

    monkeypatch.setattr(plots, "_save", keep)
    return figs


def test_illustration_has_no_empty_panel(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    for n in (4, 5, 6, 7):
        ill = _illustration()
        ill = {**ill, "multipliers": [0.5 * (k + 1) for k in range(n)], "weights": [ill["weights"][0]] * n,
               "effective_words": [10.0] * n}
        plots.illustration(ill, tmp_path / f"ill{n}.png")
        assert len(figs[-1].axes) == n and all(ax.get_visible() for ax in figs[-1].axes)


def test_training_layers_differ_in_colour_and_share_one_legend(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    steps = [{"step": s, "loss": 5 - s / 10, **_diag(s, 3 + s, s / 10, 30 - s)} for s in range(0, 11, 5)]
    plots.training([("none s0", "none", steps), ("inv_sqrt_d s0", "inv_sqrt_d", steps)], tmp_path / "t.png", "t")
    fig = figs[-1]
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    spread_ax = fig.axes[0]
    layer_colours = {line.get_label(): line.get_color() for line in spread_ax.lines if "layer" in line.get_label()}
    assert layer_colours["none s0, layer 0"] != layer_colours["none s0, layer 1"]


def test_sweep_plot_promises_bars_only_where_there_are_seeds(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    one = {(32, "none"): [40.2], (32, "inv_sqrt_d"): [40.1], (256, "none"): [57.0], (256, "inv_sqrt_d"): [40.0]}
    plots.perplexity_vs_width(one, {32: (0.1, None, 1), 256: (17.0, None, 1)}, 256, tmp_path / "a.png")
    ax1, ax2 = figs[-1].axes
    assert "no bars" in ax1.get_ylabel() and "min–max" not in ax1.get_ylabel()
    assert not any("SE" in t.get_text() for t in ax2.get_legend().get_texts())
    two = {k: [v[0], v[0] + 0.4] for k, v in one.items()}
    plots.perplexity_vs_width(two, {32: (0.1, 0.2, 2), 256: (17.0, 0.3, 2)}, 256, tmp_path / "b.png")
    ax1, ax2 = figs[-1].axes
    assert "min–max" in ax1.get_ylabel() and any("3 SE" in t.get_text() for t in ax2.get_legend().get_texts())


def test_fresh_plot_has_a_legend_in_each_panel(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    rows = [_fresh_row(i, d, s) for i in ("unit", "model") for d in (4, 1024) for s in ("none", "inv_sqrt_d")]
    plots.fresh_plot(rows, tmp_path / "f.png")
    assert all(ax.get_legend() is not None for ax in figs[-1].axes)
