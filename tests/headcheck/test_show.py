"""headcheck.show: the table inspect prints and the heatmaps it draws."""

from attnscale.headcheck.check import inspect_model
from attnscale.headcheck.show import format_table, plot_heatmaps
from inspect_models import ids, tiny_lm


def test_table_and_heatmaps(tmp_path):
    result = inspect_model(tiny_lm(), ids(), max_tokens=32)
    table = format_table(result).splitlines()
    # 3 header lines, a blank, 2 column titles, a row per head; a blank, a title, 2 column titles,
    # a row per layer; a blank, two titles with a line per sink or previous-token head; a blank, a title, a line
    # per frozen head (or "none"), the what-ifs' counts
    frozen = max(1, len(result.frozen_heads["model"]))
    assert len(table) == 6 + 2 * 4 + 4 + 2 + 1 + 2 + len(result.head_kinds) + 2 + frozen + 1
    assert "unscaled" in table[4] and "1/d" in table[4]
    assert table[15].startswith("per layer: the mean over its 4 heads")
    assert table[-1].startswith("  what-ifs: unscaled ") and table[-1].endswith(" of 8")
    assert plot_heatmaps(result, tmp_path / "h.png").stat().st_size > 1000
