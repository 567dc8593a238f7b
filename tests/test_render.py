"""render: blocks to HTML and Markdown; every string escaped, nothing fetched, no script."""

from __future__ import annotations

import re

from attnscale.report import render

EVIL = '<script>alert(1)</script> & "quoted" | piped'
BLOCKS = [("h1", "Title " + EVIL), ("p", EVIL), ("list", "lead " + EVIL, [EVIL]),
          ("table", ["name", "verdict"], [[EVIL, "agrees"], ["x", "not run"]]), ("img", "a.png", "caption " + EVIL)]


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
    md = render.to_markdown([("p", "median < 1.5, over > 5,000, a&b, &amp; kept"), ("p", "> not a quote"),
                             ("p", "# not a heading")])
    assert "median < 1.5, over > 5,000, a&b, \\&amp; kept" in md
    assert "\\> not a quote" in md and "\\# not a heading" in md


def test_number_columns_are_right_aligned():
    blocks = [("table", ["name", "ppl", "share", "note"], [["a", "1,234.50", "5.0%", "x"], ["b", "—", "12.1%", "2 y"]])]
    md = render.to_markdown(blocks)
    assert "|---|---:|---:|---|" in md
    page = render.to_html(blocks, {})
    assert '<td class="num">1,234.50</td>' in page and "<td>x</td>" in page


def test_banner_is_set_apart():
    assert '<p class="banner">Quick preset</p>' in render.to_html([("banner", "Quick preset")], {})
    assert render.to_markdown([("banner", "Quick *preset*")]).startswith("> **Quick \\*preset\\***")
