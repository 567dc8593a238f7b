"""The report's blocks: small typed pieces that the HTML and the Markdown renderer both take.

A section is a list of these; ``render.to_html`` and ``render.to_markdown`` turn
the same list into a page and a file. Text is plain (inline code in backticks
is rendered by each format its own way); numbers are already formatted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["Heading", "Para", "Banner", "Scoreboard", "Details", "Bullets", "Image", "Table", "Block", "opening"]


@dataclass(frozen=True)
class Heading:
    level: int  # 1: the page's title, 2: a section, 3: a part of one
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Banner:
    """A paragraph set apart: what a reader must know before any number (a quick preset, say)."""

    text: str


@dataclass(frozen=True)
class Scoreboard:
    headline: str
    lines: Sequence[str] = ()


@dataclass(frozen=True)
class Details:
    """Blocks folded away under ``summary`` (HTML's <details>; Markdown passes it through)."""

    summary: str
    blocks: Sequence[Block]


@dataclass(frozen=True)
class Bullets:
    lead: str
    items: Sequence[str]


@dataclass(frozen=True)
class Image:
    file: str  # the PNG's name: beside the Markdown, inlined in the HTML
    caption: str


@dataclass(frozen=True)
class Table:
    head: Sequence[str]
    rows: Sequence[Sequence[Any]]


Block = Union[Heading, Para, Banner, Scoreboard, Details, Bullets, Image, Table]


def opening(title: str, text: str) -> list[Block]:
    """How a report section starts: its heading, then the paragraph that says what it shows and how to read it."""
    return [Heading(2, title), Para(text)]
