"""The report's document as blocks, rendered twice: one self-contained HTML page and Markdown.

A block is a tuple: ("h1" | "h2" | "p", text), ("list", lead, items),
("table", headers, rows) or ("img", png file name, caption). Every string is
escaped here and nowhere else, so one file says how a corpus name or a note
from a record reaches the page: ``html.escape`` for HTML, and for Markdown
(which passes inline HTML through) <, > and & escaped the same way, plus | in
tables. The HTML's Content-Security-Policy forbids every script and every
fetch, so even text that slipped past the escaping could not run or call out,
and the page opens offline: images are inline data URIs, the CSS is inline.
"""

from __future__ import annotations

import base64
import html
from typing import Any

__all__ = ["to_html", "to_markdown"]

_CSS = """body{font:15px/1.5 system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.v-agrees{background:#d5f5e3}td.v-differs{background:#fadbd8}td.v-not-run{background:#eee;color:#666}
img{max-width:100%;height:auto;display:block;margin:1em 0}h2{border-bottom:1px solid #ddd;margin-top:2em}"""


def to_html(blocks: list[tuple], images: dict[str, bytes]) -> str:
    """One self-contained page; ``images`` maps each "img" block's file name to its PNG bytes."""
    e = html.escape
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{e(str(blk[1]))}</{kind}>")
        elif kind == "list":
            out.append(f"<p>{e(blk[1])}</p><ul>" + "".join(f"<li>{e(str(x))}</li>" for x in blk[2]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode(images[blk[1]]).decode("ascii")
            out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(blk[2])}"><figcaption>{e(blk[2])}</figcaption></figure>')
        elif kind == "table":
            vcol = blk[1].index("verdict") if "verdict" in blk[1] else -1
            head = "".join(f"<th>{e(str(h))}</th>" for h in blk[1])
            body = "".join("<tr>" + "".join(
                (f'<td class="v-{e(str(c)).replace(" ", "-")}">' if i == vcol else "<td>") + f"{e(str(c))}</td>"
                for i, c in enumerate(r)) + "</tr>" for r in blk[2])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    title = e(next((str(b[1]) for b in blocks if b[0] == "h1"), "attnscale report"))
    # the CSP forbids every script and every fetch: the page is data, and stays offline
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{title}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(out) + "\n</body></html>\n")


def _md(x: Any) -> str:
    # Markdown passes inline HTML through, so <, > and & are escaped as in HTML
    return html.escape(str(x), quote=False)


def _md_cell(x: Any) -> str:
    return _md(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[tuple]) -> str:
    """Markdown whose images are the PNG files beside it."""
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + _md_cell(blk[1]))
        elif kind == "p":
            out.append(_md(blk[1]))
        elif kind == "list":
            out.append(_md(blk[1]) + "\n\n" + "\n".join(f"- {_md(x)}" for x in blk[2]))
        elif kind == "img":
            out.append(f"![{_md_cell(blk[2])}]({blk[1]})")
        elif kind == "table":
            out.append("\n".join(["| " + " | ".join(_md_cell(h) for h in blk[1]) + " |",
                                  "|" + "---|" * len(blk[1]),
                                  *("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in blk[2])]))
    return "\n\n".join(out) + "\n"
