"""The report's document as blocks, rendered twice: one self-contained HTML page and Markdown.

A block is a tuple: ("h1" | "h2" | "h3" | "p" | "banner", text), ("list", lead, items),
("table", headers, rows) or ("img", png file name, caption). A "banner" is what
a reader must see first (the preset that made the records). Every string is
escaped here and nowhere else, so one file says how a corpus name or a note
from a record reaches the page: ``html.escape`` for HTML; for Markdown (which
passes inline HTML through) a backslash before each < that could open a tag and
each & that could start an entity, so the file reads as plain text (no "&lt;")
and renders the same, plus | in tables. Table columns whose cells are all
numbers are right-aligned in both. The HTML's Content-Security-Policy forbids every script and every
fetch, so even text that slipped past the escaping could not run or call out,
and the page opens offline: images are inline data URIs, the CSS is inline.
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any

__all__ = ["to_html", "to_markdown"]

_CSS = """body{font:15px/1.5 system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.v-agrees{background:#d5f5e3}td.v-differs{background:#fadbd8}td.v-not-run{background:#eee;color:#666}
td.v-partly{background:#fcf3cf}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
p.banner{border:2px solid #b9770e;background:#fef5e7;padding:.6em .9em;font-weight:600}
img{max-width:100%;height:auto;display:block;margin:1em 0}h2{border-bottom:1px solid #ddd;margin-top:2em}"""


_NUMBER = re.compile(r"^[+−-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?%?$")


def numeric_columns(rows: list[list]) -> list[bool]:
    """For each column: True when every cell is a number or "—" (none)."""
    cols = max((len(r) for r in rows), default=0)
    out = []
    for i in range(cols):
        cells = [str(r[i]).strip() for r in rows if i < len(r)]
        out.append(bool(cells) and all(c == "—" or _NUMBER.match(c) for c in cells))
    return out


def to_html(blocks: list[tuple], images: dict[str, bytes]) -> str:
    """One self-contained page; ``images`` maps each "img" block's file name to its PNG bytes."""
    e = html.escape
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2", "h3", "p"):
            out.append(f"<{kind}>{e(str(blk[1]))}</{kind}>")
        elif kind == "banner":
            out.append(f'<p class="banner">{e(str(blk[1]))}</p>')
        elif kind == "list":
            out.append(f"<p>{e(blk[1])}</p><ul>" + "".join(f"<li>{e(str(x))}</li>" for x in blk[2]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode(images[blk[1]]).decode("ascii")
            out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(blk[2])}"><figcaption>{e(blk[2])}</figcaption></figure>')
        elif kind == "table":
            vcol = blk[1].index("verdict") if "verdict" in blk[1] else -1
            num = numeric_columns(blk[2])
            head = "".join(('<th class="num">' if i < len(num) and num[i] else "<th>") + f"{e(str(h))}</th>"
                           for i, h in enumerate(blk[1]))
            body = "".join("<tr>" + "".join(
                (f'<td class="v-{e(str(c)).replace(" ", "-")}">' if i == vcol
                 else '<td class="num">' if i < len(num) and num[i] else "<td>") + f"{e(str(c))}</td>"
                for i, c in enumerate(r)) + "</tr>" for r in blk[2])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    title = e(next((str(b[1]) for b in blocks if b[0] == "h1"), "attnscale report"))
    # the CSP forbids every script and every fetch: the page is data, and stays offline
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
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


def to_markdown(blocks: list[tuple]) -> str:
    """Markdown whose images are the PNG files beside it."""
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2", "h3"):
            out.append({"h1": "# ", "h2": "## ", "h3": "### "}[kind] + _md_cell(blk[1]))
        elif kind == "p":
            out.append(_md(blk[1]))
        elif kind == "banner":
            out.append("> **" + _md(blk[1]).replace("*", "\\*") + "**")
        elif kind == "list":
            out.append(_md(blk[1]) + "\n\n" + "\n".join(f"- {_md(x)}" for x in blk[2]))
        elif kind == "img":
            out.append(f"![{_md_cell(blk[2])}]({blk[1]})")
        elif kind == "table":
            num = numeric_columns(blk[2])
            out.append("\n".join(["| " + " | ".join(_md_cell(h) for h in blk[1]) + " |",
                                  "|" + "".join("---:|" if n else "---|" for n in num) + ("---|" * (len(blk[1]) - len(num))),
                                  *("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in blk[2])]))
    return "\n\n".join(out) + "\n"
