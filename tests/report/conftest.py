"""The report room's fixtures."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest


def blank_png(width: int, height: int) -> bytes:
    """A valid grey PNG of ``width`` × ``height`` pixels (8-bit greyscale, every row filter 0)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\x00" + b"\xff" * width) * height
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


@pytest.fixture
def words_only(monkeypatch):
    """Every figure built, laid out at its own size, but written as a blank PNG of that size instead of rendered:
    for the tests that read the report's words (rendering is three quarters of a build; test_plots, test_browser
    and the tests of this room that compare images render every figure)."""
    from attnscale import drawing

    def save(fig, path, rect=(0, 0, 1, 1)):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        w, h = (round(v * drawing.DPI) for v in fig.get_size_inches())
        path.write_bytes(blank_png(w, h))
        drawing.pyplot().close(fig)
        return path

    monkeypatch.setattr(drawing, "save", save)


@pytest.fixture(scope="module")
def corpus():
    """The packaged default corpus, character tokens: the held-out split the frozen-share tests read."""
    from attnscale.runs.runner import CorpusSpec

    return CorpusSpec("default", "char").load()
