"""render: blocks to HTML and Markdown; every string escaped, nothing fetched, no script."""

from __future__ import annotations

import re

import pytest

from attnscale.report import render
from attnscale.report.blocks import Heading, Para, Banner, Scoreboard, Details, Bullets, Image, Table

EVIL = '<script>alert(1)</script> & "quoted" | piped'
BLOCKS = [Heading(1, "Title " + EVIL), Para(EVIL), Bullets("lead " + EVIL, [EVIL]),
          Table(["name", "verdict"], [[EVIL, "agrees"], ["x", "not run"]]), Image("a.png", "caption " + EVIL)]


def test_html_escapes_every_string_and_allows_no_script_or_fetch():
    page = render.to_html(BLOCKS, {"a.png": b"\x89PNG fake"})
    assert "<script>" not in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 8  # every block, title and alt too
    assert "default-src 'none'; img-src data:" in page  # a CSP: even unescaped text could not run or call out
    assert 'src="data:image/png;base64,' in page and "a.png" not in page
    assert '<td class="v-agrees">agrees</td>' in page and '<td class="v-not-run">not run</td>' in page


def test_markdown_escapes_html_and_table_pipes():
    md = render.to_markdown(BLOCKS)
    assert not re.search(r"(?<!\\)<(script|/script)", md) and "\\<script>alert(1)\\</script>" in md
    assert not re.search(r"&[#\w]+;", md)  # no HTML entities: the file reads as it renders
    row = next(line for line in md.splitlines() if line.startswith("| \\<script"))
    assert row.count(" | ") == 1 and "\\| piped" in row  # the pipe in the text does not split the cell
    assert "![caption \\<script>alert(1)\\</script>" in md and "](a.png)" in md


def test_markdown_leaves_comparisons_readable_and_entities_literal():
    md = render.to_markdown([Para("median < 1.5, over > 5,000, a&b, &amp; kept"), Para("> not a quote"),
                             Para("# not a heading")])
    assert "median < 1.5, over > 5,000, a&b, \\&amp; kept" in md
    assert "\\> not a quote" in md and "\\# not a heading" in md


def test_number_columns_are_right_aligned():
    blocks = [Table(["name", "ppl", "share", "note"], [["a", "1,234.50", "5.0%", "x"], ["b", "—", "12.1%", "2 y"]])]
    md = render.to_markdown(blocks)
    assert "|---|---:|---:|---|" in md
    page = render.to_html(blocks, {})
    assert '<td class="num">1,234.50</td>' in page and "<td>x</td>" in page


def test_banner_is_set_apart():
    assert '<p class="banner">Quick preset</p>' in render.to_html([Banner("Quick preset")], {})
    assert render.to_markdown([Banner("Quick *preset*")]).startswith("> **Quick \\*preset\\***")


def _png(width: int, height: int = 10) -> bytes:
    import struct
    import zlib

    raw = b"".join(b"\x00" + b"\xff" * width for _ in range(height))  # grey, filter 0 per row
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_inline_code_is_code_in_html_and_backticks_in_markdown():
    blocks = [Heading(2, "Run `attnscale spread`"), Para("then `attnscale report` <b>"), Bullets("lead", ["`x`"]),
              Table(["a"], [["`cell`"]]), Image("a.png", "made by `plots`")]
    page = render.to_html(blocks, {"a.png": _png(20)})
    assert "<code>attnscale spread</code>" in page and "<code>attnscale report</code> &lt;b&gt;" in page
    assert "<li><code>x</code></li>" in page and "<code>cell</code></td>" in page
    assert 'alt="made by plots"' in page and "<figcaption>made by <code>plots</code></figcaption>" in page
    assert "`" not in page
    md = render.to_markdown(blocks)
    assert "## Run `attnscale spread`" in md and "`attnscale report` \\<b>" in md


def test_tables_scroll_in_their_own_box_and_details_fold():
    blocks = [Details("Every run (2 records)", [Table(["run"], [["a"], ["b"]])])]
    page = render.to_html(blocks, {})
    assert '<details><summary>Every run (2 records)</summary><div class="wide"><table>' in page
    assert "</table></div></details>" in page and "<details open" not in page
    assert "div.wide,figure{overflow-x:auto" in page  # the box scrolls, not the page
    md = render.to_markdown(blocks)
    assert md.startswith("<details><summary>Every run (2 records)</summary>\n\n| run |") and "</details>" in md


def test_a_figure_is_never_shown_below_its_smallest_legible_width():
    assert render.png_width(_png(1234)) == 1234
    page = render.to_html([Image("a.png", "c")], {"a.png": _png(1000)}, min_scale=0.6545)
    assert 'style="min-width:655px"' in page
    assert "style=" not in render.to_html([Image("a.png", "c")], {"a.png": _png(1000)})


def test_scoreboard_is_a_box_with_its_claims():
    page = render.to_html([Scoreboard("Scoreboard: 1 agree", ["claim: differs"])], {})
    assert '<div class="scoreboard"><p><strong>Scoreboard: 1 agree</strong></p><ul><li>claim: differs</li></ul></div>' in page
    assert render.to_markdown([Scoreboard("S", ["c"])]) == "**S**\n\n- c\n"


def test_a_block_that_is_not_a_report_block_is_refused_by_both_renderers():
    for render_one in (lambda b: render.to_html(b, {}), render.to_markdown):
        with pytest.raises(TypeError, match="not a report block"):
            render_one([("h2", "a tuple, as blocks were once written")])
