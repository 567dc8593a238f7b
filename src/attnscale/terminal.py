"""Plain-text tables for the terminal: the one place where columns are aligned.

Each column is as wide as its widest cell (title included), so a longer scheme
name or a larger number widens its column instead of shifting the ones after it.
Cells arrive already formatted: the callers decide how a number reads, this
module only lines the text up."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["table"]


def table(titles: Sequence[str], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """The title line and one line per row, each cell padded to its column's width.

    ``align`` has one character per column: ``<`` (text, to the left) or ``>``
    (numbers, to the right). Columns are one space apart; lines carry no trailing
    spaces, so a left-aligned last column (a status, an example) ends where its text does."""
    if len(align) != len(titles) or set(align) - {"<", ">"}:
        raise ValueError(f"align takes one of '<' or '>' per column ({len(titles)}), got {align!r}")
    cells = [list(titles)] + [[str(c) for c in row] for row in rows]
    for line in cells[1:]:
        if len(line) != len(titles):
            raise ValueError(f"a row has {len(line)} cells for {len(titles)} columns: {line}")
    widths = [max(len(line[i]) for line in cells) for i in range(len(titles))]
    return [" ".join(f"{c:{a}{w}}" for c, a, w in zip(line, align, widths)).rstrip() for line in cells]
