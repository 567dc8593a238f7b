"""The report's document as blocks, rendered twice: one self-contained HTML page and Markdown.

A block is one of the small typed pieces of ``report.blocks``: a Heading, Para,
Banner, Bullets, Table, Image, Scoreboard, or Details (blocks folded away until a
reader opens them). The Scoreboard is what a reader must see first (how many
claims agree, and which do not); a Banner comes next (the preset that made the records). Text between
backticks is code: ``<code>`` in HTML, kept as written in Markdown. Every string is
escaped here and nowhere else, so one file says how a corpus name or a note
from a record reaches the page: ``html.escape`` for HTML; for Markdown (which
passes inline HTML through) a backslash before each < that could open a tag and
each & that could start an entity, so the file reads as plain text (no "&lt;")
and renders the same, plus | in tables. Table columns whose cells are all
numbers are right-aligned in both. The HTML's Content-Security-Policy forbids every script and every
fetch, so even text that slipped past the escaping could not run or call out,
and the page opens offline: images are inline data URIs, the CSS is inline.

On a narrow screen (a 390-px phone) the page itself never scrolls sideways: long
words break, and a wide table or figure scrolls inside its own box. A figure is
never shown narrower than ``min_scale`` of its own width (``to_html``), the
shrink its smallest text can take and still read (``plots.SMALLEST_SHOWN``).
"""

from __future__ import annotations

import base64
import html
import math
import re
from typing import Any

from attnscale.runs.writers import page_mark
from attnscale.report.blocks import Banner, Block, Bullets, Details, Heading, Image, Para, Scoreboard, Table

__all__ = ["to_html", "to_markdown"]

# on a phone, a column of words keeps room for a few words (10em) and its table scrolls sideways
# in its own box, rather than squeezing every cell into a column a word wide
_CSS = """body{font:15px/1.5 system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222;
overflow-wrap:anywhere}h1{font-size:1.7em;line-height:1.25}
div.wide,figure{overflow-x:auto;margin:1em 0}figure{margin:1em 0}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:4px 7px;text-align:left;vertical-align:top;
overflow-wrap:normal;min-width:3em}td:first-child{min-width:7em}
code{font:.92em ui-monospace,monospace;background:#f4f4f4;padding:0 .2em;border-radius:3px}
div.scoreboard{border:2px solid #555;padding:.5em .9em;margin:1em 0}div.scoreboard p{margin:.3em 0;font-size:1.15em}
details{margin:1em 0}summary{cursor:pointer;font-weight:600}
@media (max-width:600px){td:not(.num):not([class^=v-]){min-width:10em}}
th{background:#f2f2f2}td.v-agrees{background:#d5f5e3}td.v-differs{background:#fadbd8}td.v-not-run{background:#eee;color:#666}
td.v-partly{background:#fcf3cf}td.v-inconclusive{background:#e8e4f4}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
p.banner{border:2px solid #b9770e;background:#fef5e7;padding:.6em .9em;font-weight:600}
img{max-width:100%;height:auto;display:block;margin:0 0 .5em}h2{border-bottom:1px solid #ddd;margin-top:2em}"""


_NUMBER = re.compile(r"^[+−-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?%?$")


def numeric_columns(rows: list[list]) -> list[bool]:
    """For each column: True when every cell is a number or "—" (none)."""
    cols = max((len(r) for r in rows), default=0)
    out = []
    for i in range(cols):
        cells = [str(r[i]).strip() for r in rows if i < len(r)]
        out.append(bool(cells) and all(c == "—" or _NUMBER.match(c) for c in cells))
    return out


_CODE = re.compile(r"`([^`\n]+)`")


def _plain(x: Any) -> str:
    """Text with its code marks dropped: for an attribute or a title, where no tag can go."""
    return _CODE.sub(r"\1", str(x))


def _e(x: Any) -> str:
    """Escaped text, its `code` spans as <code> (escaping leaves backticks alone)."""
    return _CODE.sub(r"<code>\1</code>", html.escape(str(x)))


def png_width(png: bytes) -> int:
    """A PNG's width in pixels, from its header (IHDR comes first; width is bytes 16 to 20)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big")


def to_html(blocks: list[Block], images: dict[str, bytes], min_scale: float = 0.0, refresh: float | None = None,
            generator: str | None = None) -> str:
    """One self-contained page; ``images`` maps each Image block's file name to its PNG bytes.
    No figure is shown narrower than ``min_scale`` × its own width (its box scrolls instead).
    ``refresh``: the browser reloads the page every that many seconds (a meta refresh, no script).
    ``generator``: the command that writes the page, marked in its head (``runs.writers.page_mark``), so
    that no other command writes over it."""
    return _page(_html_blocks(blocks, images, min_scale), blocks, refresh, generator)


def _html_table(blk: Table) -> str:
    vcol = list(blk.head).index("verdict") if "verdict" in blk.head else -1
    num = numeric_columns(blk.rows)
    head = "".join(('<th class="num">' if i < len(num) and num[i] else "<th>") + f"{_e(h)}</th>"
                   for i, h in enumerate(blk.head))
    body = "".join("<tr>" + "".join(
        (f'<td class="v-{html.escape(str(c)).replace(" ", "-")}">' if i == vcol
         else '<td class="num">' if i < len(num) and num[i] else "<td>") + f"{_e(c)}</td>"
        for i, c in enumerate(r)) + "</tr>" for r in blk.rows)
    # a wide table scrolls in its own box: the page keeps the screen's width
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _html_blocks(blocks: list[Block], images: dict[str, bytes], min_scale: float) -> list[str]:
    e = _e
    out = []
    for blk in blocks:
        if isinstance(blk, Heading):
            out.append(f"<h{blk.level}>{e(blk.text)}</h{blk.level}>")
        elif isinstance(blk, Para):
            out.append(f"<p>{e(blk.text)}</p>")
        elif isinstance(blk, Banner):
            out.append(f'<p class="banner">{e(blk.text)}</p>')
        elif isinstance(blk, Scoreboard):
            out.append(f'<div class="scoreboard"><p><strong>{e(blk.headline)}</strong></p>'
                       + ("<ul>" + "".join(f"<li>{e(x)}</li>" for x in blk.lines) + "</ul>" if blk.lines else "") + "</div>")
        elif isinstance(blk, Details):
            out.append(f"<details><summary>{e(blk.summary)}</summary>"
                       + "\n".join(_html_blocks(blk.blocks, images, min_scale)) + "</details>")
        elif isinstance(blk, Bullets):
            out.append(f"<p>{e(blk.lead)}</p><ul>" + "".join(f"<li>{e(x)}</li>" for x in blk.items) + "</ul>")
        elif isinstance(blk, Image):
            png = images[blk.file]
            data = base64.b64encode(png).decode("ascii")
            least = f' style="min-width:{math.ceil(min_scale * png_width(png))}px"' if min_scale > 0 else ""
            out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(_plain(blk.caption))}"{least}>'
                       f"<figcaption>{e(blk.caption)}</figcaption></figure>")
        elif isinstance(blk, Table):
            out.append(_html_table(blk))
        else:
            raise TypeError(f"not a report block: {blk!r}")
    return out


def _page(out: list[str], blocks: list[Block], refresh: float | None = None, generator: str | None = None) -> str:
    title = html.escape(_plain(next((str(b.text) for b in blocks if isinstance(b, Heading) and b.level == 1),
                                    "attnscale report")))
    reload = "" if refresh is None else f"<meta http-equiv=\"refresh\" content=\"{refresh:g}\">"
    reload += "" if generator is None else page_mark(generator)
    # the CSP forbids every script and every fetch: the page is data, and stays offline
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + reload +
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{title}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(out) + "\n</body></html>\n")


_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")  # only these open raw HTML (CommonMark 6.6)
_ENTITY = re.compile(r"&(?=#?\w+;)")


def _md(x: Any) -> str:
    # Markdown passes inline HTML and entities through: a backslash makes such a < or & literal,
    # and leaves "< 1.5" or "> 5,000" as they are, readable in the file itself
    text = _ENTITY.sub(r"\&", _TAG_START.sub(r"\<", str(x).replace("\\", "\\\\")))
    return re.sub(r"^(\s*)([>#])", r"\1\\\2", text, flags=re.M)  # no quote or heading from a line's start


def _md_cell(x: Any) -> str:
    return _md(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    """Markdown whose images are the PNG files beside it."""
    return "\n\n".join(_md_blocks(blocks)) + "\n"


def _md_blocks(blocks: list[Block]) -> list[str]:
    out = []
    for blk in blocks:
        if isinstance(blk, Scoreboard):
            out.append(f"**{_md(blk.headline)}**" + ("\n\n" + "\n".join(f"- {_md(x)}" for x in blk.lines) if blk.lines else ""))
        elif isinstance(blk, Details):  # Markdown has no fold; HTML's passes through where it renders (GitHub)
            out.append(f"<details><summary>{_md_cell(blk.summary)}</summary>\n\n" + "\n\n".join(_md_blocks(blk.blocks))
                       + "\n\n</details>")
        elif isinstance(blk, Heading):
            out.append("#" * blk.level + " " + _md_cell(blk.text))
        elif isinstance(blk, Para):
            out.append(_md(blk.text))
        elif isinstance(blk, Banner):
            out.append("> **" + _md(blk.text).replace("*", "\\*") + "**")
        elif isinstance(blk, Bullets):
            out.append(_md(blk.lead) + "\n\n" + "\n".join(f"- {_md(x)}" for x in blk.items))
        elif isinstance(blk, Image):
            out.append(f"![{_md_cell(blk.caption)}]({blk.file})")
        elif isinstance(blk, Table):
            num = numeric_columns(blk.rows)
            out.append("\n".join(["| " + " | ".join(_md_cell(h) for h in blk.head) + " |",
                                  "|" + "".join("---:|" if n else "---|" for n in num) + ("---|" * (len(blk.head) - len(num))),
                                  *("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in blk.rows)]))
        else:
            raise TypeError(f"not a report block: {blk!r}")
    return out
