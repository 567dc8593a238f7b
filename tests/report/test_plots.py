"""plots: each figure is written from plain values, legible where it is shown."""

from __future__ import annotations

from test_report import _diag, _fresh_row, _illustration, _spread_rows

from attnscale import drawing
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
        plots.perplexity_vs_head_dim(cells, {32: (0.05, None, 1), 256: (17.0, None, 1)}, 256, tmp_path / "ppl.png"),
    ]
    assert all(_is_png(p) for p in made)


def _capture(monkeypatch):
    """The figures the plot functions draw, kept before they are closed."""
    figs = []
    save = drawing.save

    def keep(fig, path, rect=(0, 0, 1, 1)):
        figs.append(fig)
        return save(fig, path, rect)

    monkeypatch.setattr(drawing, "save", keep)
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
    plots.perplexity_vs_head_dim(one, {32: (0.1, None, 1), 256: (17.0, None, 1)}, 256, tmp_path / "a.png")
    ax1, ax2 = figs[-1].axes
    assert "no bars" in ax1.get_ylabel() and "min–max" not in ax1.get_ylabel()
    assert not any("SE" in t.get_text() for t in ax2.get_legend().get_texts())
    two = {k: [v[0], v[0] + 0.4] for k, v in one.items()}
    plots.perplexity_vs_head_dim(two, {32: (0.1, 0.2, 2), 256: (17.0, 0.3, 2)}, 256, tmp_path / "b.png")
    ax1, ax2 = figs[-1].axes
    assert "min–max" in ax1.get_ylabel() and any("3 SE" in t.get_text() for t in ax2.get_legend().get_texts())


def test_fresh_plot_has_a_legend_in_each_panel(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    rows = [_fresh_row(i, d, s) for i in ("unit", "model") for d in (4, 1024) for s in ("none", "inv_sqrt_d")]
    plots.fresh_plot(rows, tmp_path / "f.png")
    assert all(ax.get_legend() is not None for ax in figs[-1].axes)


def _texts(fig) -> list:
    """Every text a reader can see in ``fig``: titles, labels, ticks, legends, notes."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
            and all(p.get_visible() for p in (t.axes, t.get_figure()) if p is not None)]


def _every_figure(tmp_path) -> None:
    """Each figure of the report once, with every scheme where it has schemes."""
    schemes = ["none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp"]
    fresh = [_fresh_row(i, d, s) for i in ("unit", "model") for d in (4, 64, 1024) for s in ("none", "inv_sqrt_d")]
    steps = [{"step": s, "loss": 5 - s / 10, "lr": 1e-3, **_diag(s, 3 + s, s / 10, 30 - s)} for s in range(0, 11, 5)]
    cells = {(32, "none"): [40.0, 40.2], (32, "inv_sqrt_d"): [40.1, 40.0], (256, "none"): [57.0, 57.5],
             (256, "inv_sqrt_d"): [40.0, 40.4]}
    curve = [{"lr": lr, "mean": 3 + lr, "se": 0.01, "diverged": lr > 0.02} for lr in (1e-3, 1e-2, 3e-2)]
    plots.spread_plot(_spread_rows(), tmp_path / "spread.png")
    plots.fresh_plot(fresh, tmp_path / "fresh.png")
    plots.illustration({**_illustration(), "multipliers": [0.25, 1, 4, 16, 32],
                        "weights": _illustration()["weights"] + _illustration()["weights"][:1],
                        "effective_words": [50.0, 30.0, 2.0, 1.0, 1.0]}, tmp_path / "ill.png")
    plots.training([("none, seed 0", "none", steps), ("1/√d, seed 0", "inv_sqrt_d", steps)], tmp_path / "t.png", "t",
                   {"spread": [(5000.0, "course: over 5,000", "none")], "frozen_fraction": [(0.999, "99.9%", "none")]})
    plots.perplexity_vs_head_dim(cells, {32: (0.05, 0.1, 2), 256: (17.0, 0.3, 2)}, 256, tmp_path / "ppl.png")
    plots.loss_vs_lr({w: {s: curve for s in schemes} for w in (64, 256)}, tmp_path / "lr.png")
    plots.sensitivity_vs_head_dim({s: [(64, 0.2, 0.01), (256, 0.15, 0.02)] for s in schemes}, tmp_path / "sens.png")
    plots.max_logit_over_steps({f"lr {lr}": {s: [(0, 1.0), (10, 50.0)] for s in schemes} for lr in ("3e-3", "3e-2")},
                               tmp_path / "logit.png", "t")
    plots.random_score_overlay({"fresh": [("none", 8.0, 1.2, 64), ("inv_sqrt_d", 1.0, 40.0, 64)],
                                "trained": {s: [(1.0, 10.0, 0), (2.0, 5.0, 10)] for s in schemes},
                                "steps": {s: [(0, 1.0, 10.0, 11.0), (10, 2.0, 5.0, 6.0)] for s in schemes},
                                "head_dim": 64, "lr": 3e-3, "context": 32}, tmp_path / "theory.png")
    plots.end_spread_by_setup({"learning rate": [("1e-3 (base)", {"none": (300.0, 10.0), "inv_sqrt_d": (4.0, 0.2)}),
                                                 ("3e-3", {"none": (900.0, 50.0), "inv_sqrt_d": (5.0, 0.3)})]},
                              {"5,000": (5000.0, "none"), "3.4": (3.4, "inv_sqrt_d")}, tmp_path / "setup.png", "t")


def test_every_figure_is_legible_where_it_is_shown(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    _every_figure(tmp_path)
    assert len(figs) == 10
    small = [(f"figure {i}", t.get_text()[:30], t.get_fontsize()) for i, fig in enumerate(figs) for t in _texts(fig)
             if t.get_fontsize() < plots.MIN_FONT_PT]
    assert small == []
    # shown at SMALLEST_SHOWN of their width, 9-pt text is 9 px on screen
    assert abs(plots.MIN_FONT_PT * plots.DPI / 72 * plots.SMALLEST_SHOWN - plots.SCREEN_TEXT_PX) < 1e-9
    # and no figure is so wide that a desktop column (1,180 px) would show it smaller than that
    assert max(f.get_figwidth() * plots.DPI * plots.SMALLEST_SHOWN for f in figs) <= 1180
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for fig in figs:
        renderer = FigureCanvasAgg(fig).get_renderer()  # the figure was closed once saved: lay it out again
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None and len(legend.get_texts()) > 5:  # a long legend inside the axes hides lines
                box = legend.get_window_extent(renderer)
                assert not box.overlaps(ax.get_window_extent(renderer)), [t.get_text() for t in legend.get_texts()]


def test_schemes_that_overlap_get_a_panel_each_and_readers_names(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    curve = [{"lr": lr, "mean": 3.0, "se": 0.01, "diverged": False} for lr in (1e-3, 1e-2)]
    schemes = ["none", "inv_sqrt_d", "inv_d", "qk_norm", "softcap", "learned_temp"]
    plots.loss_vs_lr({64: {s: curve for s in schemes}}, tmp_path / "lr.png")
    titles = [ax.get_title() for ax in figs[-1].axes if ax.get_visible()]
    assert titles == ["none, d = 64", "1/√d, d = 64", "1/d (muP), d = 64", "qk-norm, d = 64", "soft-cap 50, d = 64",
                      "learned temperature, d = 64"]


def test_training_plot_draws_the_targets_it_is_given(monkeypatch, tmp_path):
    figs = _capture(monkeypatch)
    steps = [{"step": s, "loss": 5 - s / 10, **_diag(s, 3 + s, s / 10, 30 - s)} for s in range(0, 11, 5)]
    plots.training([("none, seed 0", "none", steps)], tmp_path / "t.png", "t",
                   {"spread": [(5000.0, "course: over 5,000", "none")], "frozen_fraction": [(0.999, "99.9%", "none")]})
    spread_ax, frozen_ax = figs[-1].axes[:2]
    flat = lambda ax: [line.get_ydata()[0] for line in ax.lines if len(set(line.get_ydata())) == 1]  # noqa: E731
    assert 5000.0 in flat(spread_ax) and 99.9 in [round(y, 6) for y in flat(frozen_ax)]
    assert "course: over 5,000" in [t.get_text() for t in spread_ax.texts]
    assert spread_ax.get_ylim()[1] >= 5000.0  # the axis reaches the target: the gap to it shows
    plots.training([("none, seed 0", "none", steps)], tmp_path / "u.png", "t")
    assert figs[-1].axes[0].texts == [] or not figs[-1].axes[0].texts
