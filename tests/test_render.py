"""render: blocks to HTML and Markdown; every string escaped, nothing fetched, no script."""

from __future__ import annotations

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
    assert "<script>" not in md and "&lt;script&gt;" in md
    row = next(line for line in md.splitlines() if line.startswith("| &lt;script"))
    assert row.count(" | ") == 1 and "\\| piped" in row  # the pipe in the text does not split the cell
    assert "![caption &lt;script&gt;alert(1)&lt;/script&gt;" in md and "](a.png)" in md
